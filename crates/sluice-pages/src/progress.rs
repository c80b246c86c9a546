//! Progress of long work: bars (overall and per slice: docs, docs/s, MB/s,
//! ETA) on a terminal, plain periodic lines otherwise.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long-running work reports its progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// Bars on a terminal, lines otherwise.
    Auto,
    /// Bars (overall and per slice).
    Bars,
    /// A plain line every interval.
    Lines,
    /// Nothing.
    Off,
}

/// Counters one slice (or task) advances; read by the reporter.
#[derive(Debug, Default)]
pub struct Counter {
    /// Documents so far.
    pub docs: AtomicU64,
    /// Bytes so far.
    pub bytes: AtomicU64,
    /// Pages so far.
    pub pages: AtomicU64,
    /// Whether the slice has finished.
    pub done: AtomicBool,
}

impl Counter {
    /// Counts one page of `docs` documents and `bytes` bytes.
    pub fn add(&self, docs: u64, bytes: u64) {
        self.docs.fetch_add(docs, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.pages.fetch_add(1, Ordering::Relaxed);
    }
}

/// Draws the counters until `stop` is set; returns when it is.
pub struct Reporter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reporter {
    /// `what` names the work ("export", "read"); `total_docs` is the
    /// expected count when known (for ETA); `start` is the time origin.
    #[expect(clippy::expect_used, reason = "each expect states its invariant")]
    pub fn start(
        mode: ProgressMode,
        what: &'static str,
        counters: Arc<Vec<Counter>>,
        total_docs: Option<u64>,
        interval: Duration,
    ) -> Reporter {
        let stop = Arc::new(AtomicBool::new(false));
        let mode = match mode {
            ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Bars,
            ProgressMode::Auto => ProgressMode::Lines,
            m => m,
        };
        let thread = (mode != ProgressMode::Off).then(|| {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("{what}-progress"))
                .spawn(move || match mode {
                    ProgressMode::Bars => bars(what, &counters, total_docs, &stop),
                    _ => lines(what, &counters, total_docs, &stop, interval),
                })
                .expect("spawn progress thread")
        });
        Reporter { stop, thread }
    }

    /// Draws the last state and returns once the reporter has stopped.
    pub fn finish(self) {}
}

impl Drop for Reporter {
    /// Stops and joins the reporter thread (also when the work failed).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn sums(counters: &[Counter]) -> (u64, u64, usize) {
    let docs = counters
        .iter()
        .map(|c| c.docs.load(Ordering::Relaxed))
        .sum();
    let bytes = counters
        .iter()
        .map(|c| c.bytes.load(Ordering::Relaxed))
        .sum();
    let done = counters
        .iter()
        .filter(|c| c.done.load(Ordering::Relaxed))
        .count();
    (docs, bytes, done)
}

fn rate_line(docs: u64, bytes: u64, secs: f64, total: Option<u64>) -> String {
    let secs = secs.max(1e-3);
    let docs_per_s = docs as f64 / secs;
    let eta = match total {
        Some(t) if docs_per_s > 0.0 && t > docs => {
            format!(", ETA {:.0} s", (t - docs) as f64 / docs_per_s)
        }
        _ => String::new(),
    };
    format!(
        "{docs}{} docs, {:.0} docs/s, {:.1} MB/s{eta}",
        total.map(|t| format!("/{t}")).unwrap_or_default(),
        docs_per_s,
        bytes as f64 / secs / 1e6
    )
}

fn lines(
    what: &str,
    counters: &[Counter],
    total: Option<u64>,
    stop: &AtomicBool,
    interval: Duration,
) {
    let start = Instant::now();
    let mut next = start + interval;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() < next {
            continue;
        }
        next += interval;
        let (docs, bytes, done) = sums(counters);
        eprintln!(
            "{what}: {} ({done}/{} slices done)",
            rate_line(docs, bytes, start.elapsed().as_secs_f64(), total),
            counters.len()
        );
    }
}

#[expect(
    clippy::expect_used,
    reason = "the progress template is a constant known to parse"
)]
fn bars(what: &str, counters: &[Counter], total: Option<u64>, stop: &AtomicBool) {
    let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{prefix:>10} {bar:30} {msg}")
        .expect("template")
        .progress_chars("=> ");
    let overall = multi.add(ProgressBar::new(total.unwrap_or(0)));
    overall.set_style(style.clone());
    overall.set_prefix(what.to_string());
    let per_total = total.map(|t| t.div_ceil(counters.len() as u64));
    let slices: Vec<ProgressBar> = counters
        .iter()
        .enumerate()
        .map(|(i, _)| {
            let bar = multi.add(ProgressBar::new(per_total.unwrap_or(0)));
            bar.set_style(style.clone());
            bar.set_prefix(format!("slice {i}"));
            bar
        })
        .collect();
    let start = Instant::now();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        let secs = start.elapsed().as_secs_f64();
        let (docs, bytes, _) = sums(counters);
        overall.set_position(docs);
        overall.set_message(rate_line(docs, bytes, secs, total));
        for (bar, c) in slices.iter().zip(counters) {
            let d = c.docs.load(Ordering::Relaxed);
            bar.set_position(d);
            let state = if c.done.load(Ordering::Relaxed) {
                " done"
            } else {
                ""
            };
            bar.set_message(format!(
                "{}{state}",
                rate_line(d, c.bytes.load(Ordering::Relaxed), secs, None)
            ));
        }
        if stopping {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    for bar in slices.iter().chain(std::iter::once(&overall)) {
        bar.abandon();
    }
}
