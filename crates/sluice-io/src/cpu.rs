//! CPU scheduling of background threads. A thread that flushes, compacts
//! or sweeps runs when a core would otherwise idle: on a machine with as
//! many busy threads as cores, a request's thread that wakes up takes the
//! core at once instead of waiting out the background thread's time slice
//! (milliseconds under the kernel's fair scheduler, the tail of every
//! request that lands on such a core). Measured in docs/BENCHMARKS.md
//! ("Background work at idle CPU priority").
//!
//! Starvation is bounded by the work itself: background work that falls
//! behind makes writers wait (the store's write stalls), and a waiting
//! writer leaves its core to the background thread.

use std::io::Result;

/// How a background thread is scheduled against the threads that serve
/// requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackgroundCpu {
    /// The ordinary fair share, the same as every other thread.
    #[default]
    Normal,
    /// `SCHED_IDLE`: runs only on a core no normal thread wants
    /// (Linux 2.6.23).
    Idle,
}

impl BackgroundCpu {
    /// The name used on command lines and in INFO.
    pub fn name(self) -> &'static str {
        match self {
            BackgroundCpu::Normal => "normal",
            BackgroundCpu::Idle => "idle",
        }
    }

    /// Puts the calling thread under this policy. `Normal` leaves the
    /// thread as it was started.
    pub fn apply_to_this_thread(self) -> Result<()> {
        match self {
            BackgroundCpu::Normal => Ok(()),
            BackgroundCpu::Idle => set_this_thread_policy(libc::SCHED_IDLE),
        }
    }
}

impl std::str::FromStr for BackgroundCpu {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "normal" => Ok(BackgroundCpu::Normal),
            "idle" => Ok(BackgroundCpu::Idle),
            other => Err(format!(
                "unknown background CPU policy {other:?}: use idle (background work runs on \
                 cores no request wants) or normal (the same share as the request threads)"
            )),
        }
    }
}

/// The calling thread's scheduling policy (`libc::SCHED_*`).
pub fn this_thread_policy() -> Result<i32> {
    // SAFETY: sched_getscheduler takes a thread id (0: the calling thread)
    // and touches no memory of ours.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(policy)
}

fn set_this_thread_policy(policy: i32) -> Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: on Linux, sched_setscheduler with pid 0 acts on the calling
    // thread alone; it reads one sched_param through a pointer to a live
    // local and keeps no reference to it.
    let rc = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_is_applied_to_the_calling_thread_only() {
        let seen = std::thread::spawn(|| {
            BackgroundCpu::Idle.apply_to_this_thread().unwrap();
            this_thread_policy().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(seen, libc::SCHED_IDLE);
        assert_eq!(this_thread_policy().unwrap(), libc::SCHED_OTHER);
    }

    #[test]
    fn normal_leaves_the_thread_as_it_was() {
        let seen = std::thread::spawn(|| {
            BackgroundCpu::Normal.apply_to_this_thread().unwrap();
            this_thread_policy().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(seen, libc::SCHED_OTHER);
    }

    #[test]
    fn names_parse_back_and_unknown_ones_say_what_to_use() {
        for p in [BackgroundCpu::Normal, BackgroundCpu::Idle] {
            assert_eq!(p.name().parse::<BackgroundCpu>().unwrap(), p);
        }
        let e = "low".parse::<BackgroundCpu>().unwrap_err();
        assert!(
            e.contains("\"low\"") && e.contains("idle") && e.contains("normal"),
            "{e}"
        );
    }
}
