//! A pull-based Arrow reader over a producer that pushes: the producer
//! (a scan, an export read) runs on its own thread and hands batches over
//! a bounded channel, so a slow consumer holds it back and memory stays at
//! a few batches whatever the result's size.

use crate::Error;
use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{ArrowError, SchemaRef};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Batches in flight between producer and consumer.
pub const CHANNEL_BATCHES: usize = 4;

enum Msg {
    Schema(SchemaRef),
    Batch(RecordBatch),
    Failed(Error),
}

/// The producer's side: sends the schema once, then batches.
#[derive(Clone)]
pub struct Emitter {
    tx: Sender<Msg>,
    cancel: Arc<AtomicBool>,
    schema_sent: Arc<AtomicBool>,
}

impl Emitter {
    /// Sends the schema; only the first call of all clones counts.
    pub fn schema(&self, schema: SchemaRef) -> Result<(), Error> {
        if self.schema_sent.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.tx
            .send(Msg::Schema(schema))
            .map_err(|_| Error::Cancelled)
    }

    /// Whether the schema went out.
    pub fn schema_sent(&self) -> bool {
        self.schema_sent.load(Ordering::Acquire)
    }

    /// Sends a batch; blocks while the consumer is behind. Fails once the
    /// consumer is gone or cancelled, which stops the producer.
    pub fn batch(&self, batch: RecordBatch) -> Result<(), Error> {
        debug_assert!(self.schema_sent());
        if self.cancelled() {
            return Err(Error::Cancelled);
        }
        self.tx
            .send(Msg::Batch(batch))
            .map_err(|_| Error::Cancelled)
    }

    /// Whether the consumer asked the producer to stop.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

/// The consumer's side: an Arrow [`RecordBatchReader`].
pub struct BatchStream {
    schema: SchemaRef,
    rx: Option<Receiver<Msg>>,
    cancel: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    done: bool,
    interrupted: Option<InterruptCheck>,
    last_check: std::time::Instant,
}

/// Asked while a reader waits for a batch: true stops the stream (the
/// Python package checks for Ctrl-C with it).
pub type InterruptCheck = Box<dyn FnMut() -> bool + Send>;

/// How often a waiting reader asks its [`InterruptCheck`].
const INTERRUPT_POLL: Duration = Duration::from_millis(50);

impl BatchStream {
    /// Starts `produce` on its own thread and waits for its schema (or its
    /// error).
    pub fn spawn<F>(name: &str, produce: F) -> Result<BatchStream, Error>
    where
        F: FnOnce(&Emitter) -> Result<(), Error> + Send + 'static,
    {
        let (tx, rx) = bounded(CHANNEL_BATCHES);
        let cancel = Arc::new(AtomicBool::new(false));
        let emitter = Emitter {
            tx,
            cancel: cancel.clone(),
            schema_sent: Arc::new(AtomicBool::new(false)),
        };
        let worker = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Err(e) = produce(&emitter) {
                    if !matches!(e, Error::Cancelled) {
                        let _ = emitter.tx.send(Msg::Failed(e));
                    }
                }
            })
            .map_err(|e| Error::Usage(format!("starting the {name} thread: {e}")))?;
        let mut stream = BatchStream {
            schema: Arc::new(arrow_schema::Schema::empty()),
            rx: Some(rx),
            cancel,
            worker: Some(worker),
            done: false,
            interrupted: None,
            last_check: std::time::Instant::now(),
        };
        match stream.rx.as_ref().map(|rx| rx.recv()) {
            Some(Ok(Msg::Schema(s))) => stream.schema = s,
            Some(Ok(Msg::Failed(e))) => return Err(e),
            Some(Ok(Msg::Batch(_))) => {
                return Err(Error::Usage("a batch came before its schema".into()))
            }
            Some(Err(_)) | None => {
                stream.join_worker();
                return Err(Error::Usage(format!(
                    "the {name} thread ended without a result"
                )));
            }
        }
        Ok(stream)
    }

    /// The next batch, waiting at most `timeout`: `Err(Timeout)` when none
    /// came in time (so a caller can check for an interrupt and wait again).
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<RecordBatch>, Waited> {
        if self.done {
            return Ok(None);
        }
        let Some(rx) = &self.rx else {
            return Ok(None);
        };
        match rx.recv_timeout(timeout) {
            Ok(Msg::Batch(b)) => Ok(Some(b)),
            Ok(Msg::Failed(e)) => {
                self.done = true;
                Err(Waited::Failed(e))
            }
            Ok(Msg::Schema(_)) => Err(Waited::Failed(Error::Usage(
                "a second schema came in the stream".into(),
            ))),
            Err(RecvTimeoutError::Timeout) => Err(Waited::Timeout),
            Err(RecvTimeoutError::Disconnected) => {
                self.done = true;
                self.join_worker();
                Ok(None)
            }
        }
    }

    /// Has the reader ask `check` every 50 ms, whether it waits for
    /// batches or takes them as fast as they come; when it says true, the
    /// stream stops and the read ends with an error.
    pub fn set_interrupt_check(&mut self, check: InterruptCheck) {
        self.interrupted = Some(check);
    }

    /// Stops the producer; batches not yet taken are dropped.
    pub fn cancel(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.done = true;
        // Dropping the receiver wakes a producer blocked on a full channel.
        self.rx = None;
        self.join_worker();
    }

    fn join_worker(&mut self) {
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Why [`BatchStream::next_timeout`] gave no batch.
#[derive(Debug)]
pub enum Waited {
    /// None came in time.
    Timeout,
    /// The producer failed.
    Failed(Error),
}

impl Iterator for BatchStream {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.interrupted.is_some() && self.last_check.elapsed() >= INTERRUPT_POLL {
                self.last_check = std::time::Instant::now();
                if self.interrupted.as_mut().is_some_and(|check| check()) {
                    self.cancel();
                    return Some(Err(ArrowError::ExternalError(Box::new(Error::Interrupted))));
                }
            }
            let wait = match self.interrupted {
                Some(_) => INTERRUPT_POLL,
                None => Duration::from_secs(3600),
            };
            match self.next_timeout(wait) {
                Ok(Some(b)) => return Some(Ok(b)),
                Ok(None) => return None,
                Err(Waited::Timeout) => {}
                Err(Waited::Failed(e)) => return Some(Err(ArrowError::ExternalError(Box::new(e)))),
            }
        }
    }
}

impl RecordBatchReader for BatchStream {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

impl Drop for BatchStream {
    fn drop(&mut self) {
        self.cancel();
    }
}
