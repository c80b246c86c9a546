//! One clock reading per command.
//!
//! A worker times every command it runs (INFO commandstats, SLOWLOG) and
//! gives each the wall-clock time it runs at (expiry, a client's last
//! interaction). Read separately, that was four clock readings per
//! command — a fifth of a pipelined PING's time. Commands a worker runs
//! back to back are timed lap by lap instead: one command's end is the
//! next one's start, and its wall-clock time is told from the monotonic
//! clock by an anchor taken at most [`ANCHOR_FOR`] before.

use std::time::{Duration, Instant};

/// How long an anchor of the wall clock is used before it is taken again:
/// a step of the wall clock (a settime, an NTP step) shows in commands'
/// times within this.
pub(crate) const ANCHOR_FOR: Duration = Duration::from_millis(100);

/// Times the commands a worker runs in one go.
#[derive(Debug)]
pub(crate) struct CommandClock {
    /// When the command being timed started: the last lap's end.
    mark: Instant,
    /// A reading of the monotonic clock, and the wall clock's (ms since
    /// the Unix epoch) just after it.
    anchor: Instant,
    anchor_wall_ms: u64,
}

impl CommandClock {
    /// A clock whose first command starts now.
    pub(crate) fn start() -> Self {
        let now = Instant::now();
        Self {
            mark: now,
            anchor: now,
            anchor_wall_ms: super::now_ms(),
        }
    }

    /// The next command starts now: after a wait, or at the first command
    /// of a connection's turn (what came between is no command's time).
    pub(crate) fn restart(&mut self) {
        self.mark = Instant::now();
    }

    /// The wall-clock time the command being timed started at, in ms since
    /// the Unix epoch.
    pub(crate) fn wall_ms(&mut self) -> u64 {
        let since = self.mark.saturating_duration_since(self.anchor);
        if since >= ANCHOR_FOR {
            self.anchor = self.mark;
            self.anchor_wall_ms = super::now_ms();
            return self.anchor_wall_ms;
        }
        self.anchor_wall_ms + since.as_millis() as u64
    }

    /// Ends the command being timed: its time in µs. The next starts now.
    pub(crate) fn lap_us(&mut self) -> u64 {
        let now = Instant::now();
        let us = now.saturating_duration_since(self.mark).as_micros() as u64;
        self.mark = now;
        us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_are_consecutive_and_wall_time_follows_the_clock() {
        let mut clock = CommandClock::start();
        let first_wall_ms = clock.wall_ms();
        let wall_before_ms = super::super::now_ms();
        assert!(first_wall_ms.abs_diff(wall_before_ms) <= 5);
        std::thread::sleep(Duration::from_millis(20));
        let slept_us = clock.lap_us();
        assert!(slept_us >= 20_000, "a lap covers the sleep: {slept_us} µs");
        // The next lap starts where the last ended, not where it started.
        let quick_us = clock.lap_us();
        assert!(quick_us < 20_000, "{quick_us} µs");
        // Told from the anchor within the anchor's time, read afresh after.
        let told_ms = clock.wall_ms();
        assert!(
            told_ms >= first_wall_ms + 20,
            "{told_ms} vs {first_wall_ms}"
        );
        assert!(told_ms.abs_diff(super::super::now_ms()) <= 5);
        std::thread::sleep(ANCHOR_FOR + Duration::from_millis(10));
        clock.restart();
        let after_ms = clock.wall_ms();
        assert_eq!(clock.anchor, clock.mark, "an old anchor is taken again");
        assert!(after_ms >= told_ms + ANCHOR_FOR.as_millis() as u64);
        assert!(after_ms.abs_diff(super::super::now_ms()) <= 5);
    }
}
