//! The priority gate shared by both engines: queued requests wait here, high
//! before low, and low only while high holds less than its share of the depth.

use super::Priority;
use std::collections::VecDeque;

#[derive(Debug)]
pub(crate) struct PriorityGate<T> {
    high: VecDeque<T>,
    low: VecDeque<T>,
    high_issued: usize,
    low_issued: usize,
    /// Low requests are issued only while `high_issued` is below this.
    high_limit_for_low: usize,
}

impl<T> PriorityGate<T> {
    pub fn new(queue_depth: usize, high_share: f64) -> Self {
        let limit = ((queue_depth as f64 * high_share).ceil() as usize).clamp(1, queue_depth);
        PriorityGate {
            high: VecDeque::new(),
            low: VecDeque::new(),
            high_issued: 0,
            low_issued: 0,
            high_limit_for_low: limit,
        }
    }

    pub fn push(&mut self, priority: Priority, item: T) {
        match priority {
            Priority::High => self.high.push_back(item),
            Priority::Low => self.low.push_back(item),
        }
    }

    /// The next request allowed out, counted as issued.
    pub fn pop(&mut self) -> Option<(Priority, T)> {
        if let Some(item) = self.high.pop_front() {
            self.high_issued += 1;
            return Some((Priority::High, item));
        }
        if self.high_issued < self.high_limit_for_low {
            if let Some(item) = self.low.pop_front() {
                self.low_issued += 1;
                return Some((Priority::Low, item));
            }
        }
        None
    }

    /// Puts back a request that `pop` gave out but could not be issued.
    pub fn unpop(&mut self, priority: Priority, item: T) {
        self.completed(priority);
        match priority {
            Priority::High => self.high.push_front(item),
            Priority::Low => self.low.push_front(item),
        }
    }

    pub fn completed(&mut self, priority: Priority) {
        let n = match priority {
            Priority::High => &mut self.high_issued,
            Priority::Low => &mut self.low_issued,
        };
        assert!(*n > 0, "completion without an issued request");
        *n -= 1;
    }

    pub fn queued(&self) -> usize {
        self.high.len() + self.low.len()
    }

    /// Requests issued and not yet completed.
    pub fn issued(&self) -> usize {
        self.high_issued + self.low_issued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_goes_first_and_low_waits_for_share() {
        let mut g = PriorityGate::new(4, 0.5);
        g.push(Priority::Low, 'a');
        g.push(Priority::High, 'b');
        g.push(Priority::High, 'c');
        g.push(Priority::High, 'd');
        assert_eq!(g.pop(), Some((Priority::High, 'b')));
        assert_eq!(g.pop(), Some((Priority::High, 'c')));
        assert_eq!(g.pop(), Some((Priority::High, 'd')));
        // Three high in flight >= limit 2: low must wait.
        assert_eq!(g.pop(), None);
        g.completed(Priority::High);
        assert_eq!(g.pop(), None, "two high still in flight, limit is 2");
        g.completed(Priority::High);
        assert_eq!(g.pop(), Some((Priority::Low, 'a')));
        assert_eq!(g.issued(), 2);
        assert_eq!(g.queued(), 0);
    }

    #[test]
    fn unpop_restores_order_and_counts() {
        let mut g = PriorityGate::new(8, 1.0);
        g.push(Priority::High, 1);
        g.push(Priority::High, 2);
        let (p, x) = g.pop().unwrap();
        g.unpop(p, x);
        assert_eq!(g.issued(), 0);
        assert_eq!(g.pop(), Some((Priority::High, 1)));
    }
}
