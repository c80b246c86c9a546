//! The binary heap both merges keep their inputs in (a memtable walk's
//! sorted runs, an iterator's sources): indexes of the inputs, each one's
//! next key before its children's (at 2i+1 and 2i+2), so a step compares
//! about 2·log2(inputs) keys, and two while one input's keys come first.

/// Moves the input at place `at` of `heap` down to where it comes before
/// its children; `first(a, b)`: whether input `a`'s next key comes before
/// input `b`'s.
#[inline]
pub(crate) fn sift_down(heap: &mut [usize], mut at: usize, first: impl Fn(usize, usize) -> bool) {
    loop {
        let left = 2 * at + 1;
        if left >= heap.len() {
            return;
        }
        let right = left + 1;
        let child = if right < heap.len() && first(heap[right], heap[left]) {
            right
        } else {
            left
        };
        if !first(heap[child], heap[at]) {
            return;
        }
        heap.swap(at, child);
        at = child;
    }
}
