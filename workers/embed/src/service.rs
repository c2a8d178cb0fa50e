//! The embedding thread: one thread owns the model and computes what
//! callers queue, many calls' inputs packed into each pass.
//!
//! Callers tokenize on their own thread ([`EmbedService::tokenize`]) and
//! are refused there, before anything is queued, when a call is over the
//! limits ([`Limits`]). Each pass takes up to `pass_tokens` tokens, taking
//! turns across the queued calls (one input from each in turn), so a small
//! call is computed in the next pass even behind a large one; a call is
//! answered when its last input is computed.

use crate::{EmbedError, Embedder, GateWaits, Tokens};
use bulkhead_engine::ComputeGate;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use tokio::sync::oneshot;

/// What one call may ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Inputs in one call.
    pub max_inputs: usize,
    /// Tokens of one call, every input's special tokens included, after
    /// truncation.
    pub max_tokens: usize,
}

impl Limits {
    /// Whether a call of `inputs` inputs may be asked at all (its tokens
    /// are checked once tokenized): a caller refuses what fails before
    /// tokenizing anything.
    pub fn check_inputs(&self, inputs: usize) -> Result<(), Refusal> {
        if inputs == 0 {
            return Err(Refusal::Empty);
        }
        if inputs > self.max_inputs {
            return Err(Refusal::TooManyInputs {
                given: inputs,
                limit: self.max_inputs,
            });
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_inputs: 256,
            max_tokens: 32_768,
        }
    }
}

/// Why a call was refused before it was queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No inputs.
    #[error("input must not be empty")]
    Empty,
    /// More inputs than a call may have.
    #[error("{given} inputs; a call takes at most {limit}")]
    TooManyInputs {
        /// Inputs given.
        given: usize,
        /// The limit.
        limit: usize,
    },
    /// More tokens than a call may have.
    #[error("{given} tokens in all; a call takes at most {limit}")]
    TooManyTokens {
        /// Tokens given (after truncation).
        given: usize,
        /// The limit.
        limit: usize,
    },
}

/// A call's inputs, checked against the [`Limits`]: only
/// [`EmbedService::admit`] makes one, so nothing over them is ever queued.
#[derive(Debug)]
pub struct Admitted {
    inputs: Vec<Tokens>,
    tokens: usize,
}

impl Admitted {
    /// Tokens the call computes (what it is billed for).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Its inputs.
    pub fn inputs(&self) -> &[Tokens] {
        &self.inputs
    }
}

struct Job {
    inputs: Vec<Tokens>,
    /// Inputs not yet taken into a pass.
    next: usize,
    vectors: Vec<Vec<f32>>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>,
}

/// What the service holds now: calls queued or computing, and their
/// tokens (what a worker reports as its load).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Calls not yet answered.
    pub calls: usize,
    /// Their tokens.
    pub tokens: usize,
}

/// Counts a call as load until it is answered or its caller goes away.
struct Counted<'a> {
    counters: &'a Counters,
    tokens: usize,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.counters.calls.fetch_sub(1, Ordering::Relaxed);
        self.counters
            .tokens
            .fetch_sub(self.tokens, Ordering::Relaxed);
    }
}

/// Gauges of the calls in the service (written by callers only).
#[derive(Debug, Default)]
struct Counters {
    calls: AtomicUsize,
    tokens: AtomicUsize,
}

impl Counters {
    fn count(&self, tokens: usize) -> Counted<'_> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.tokens.fetch_add(tokens, Ordering::Relaxed);
        Counted {
            counters: self,
            tokens,
        }
    }
}

/// The model behind its thread.
#[derive(Clone)]
pub struct EmbedService {
    embedder: Arc<Embedder>,
    limits: Limits,
    jobs: Sender<Job>,
    counters: Arc<Counters>,
    gate_waits: Arc<GateWaits>,
}

impl std::fmt::Debug for EmbedService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbedService")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl EmbedService {
    /// Starts the thread, computing on a pool of `threads` threads, each
    /// pass at most `pass_tokens` tokens; with a `gate`, as background work
    /// behind the generation engines that hold it
    /// ([`Embedder::embed_behind`]).
    pub fn start(
        embedder: Embedder,
        limits: Limits,
        (threads, pass_tokens): (usize, usize),
        gate: Option<ComputeGate>,
    ) -> Result<Self, EmbedError> {
        let embedder = Arc::new(embedder);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("embed-{i}"))
            .build()
            .map_err(|e| EmbedError::Threads(e.to_string()))?;
        let (jobs, rx) = channel();
        let model = embedder.clone();
        let gate_waits = Arc::new(GateWaits::default());
        let waits = Arc::clone(&gate_waits);
        std::thread::Builder::new()
            .name("embed".into())
            .spawn(move || {
                let pass = |batch: &[Tokens]| match &gate {
                    Some(g) => model.embed_behind(batch, g, &waits),
                    None => model.embed(batch),
                };
                pool.install(move || run(&pass, &rx, pass_tokens.max(1)));
            })
            .map_err(|e| EmbedError::Threads(e.to_string()))?;
        Ok(EmbedService {
            embedder,
            limits,
            jobs,
            counters: Arc::default(),
            gate_waits,
        })
    }

    /// What passes waited at the compute gate for generation to finish.
    pub fn gate_waits(&self) -> &GateWaits {
        &self.gate_waits
    }

    /// The model.
    pub fn embedder(&self) -> &Embedder {
        &self.embedder
    }

    /// What one call may ask.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Checks a call's inputs against the limits.
    pub fn admit(&self, inputs: Vec<Tokens>) -> Result<Admitted, Refusal> {
        self.limits.check_inputs(inputs.len())?;
        let tokens = inputs.iter().map(Tokens::len).sum();
        if tokens > self.limits.max_tokens {
            return Err(Refusal::TooManyTokens {
                given: tokens,
                limit: self.limits.max_tokens,
            });
        }
        Ok(Admitted { inputs, tokens })
    }

    /// Calls queued or computing now.
    pub fn load(&self) -> Load {
        Load {
            calls: self.counters.calls.load(Ordering::Relaxed),
            tokens: self.counters.tokens.load(Ordering::Relaxed),
        }
    }

    /// The call's vectors, in order, once computed.
    pub async fn embed(&self, call: Admitted) -> Result<Vec<Vec<f32>>, EmbedError> {
        let _counted = self.counters.count(call.tokens);
        let (reply, answer) = oneshot::channel();
        let job = Job {
            vectors: Vec::with_capacity(call.inputs.len()),
            inputs: call.inputs,
            next: 0,
            reply,
        };
        self.jobs.send(job).map_err(|_| EmbedError::Stopped)?;
        answer.await.map_err(|_| EmbedError::Stopped)?
    }
}

/// One pass: the vectors of a batch of inputs.
type Pass<'a> = &'a dyn Fn(&[Tokens]) -> Result<Vec<Vec<f32>>, EmbedError>;

/// The thread: waits for a call, then computes passes until none waits.
fn run(pass: Pass<'_>, rx: &Receiver<Job>, pass_tokens: usize) {
    let mut queue: VecDeque<Job> = VecDeque::new();
    loop {
        if queue.is_empty() {
            match rx.recv() {
                Ok(job) => queue.push_back(job),
                Err(_) => return,
            }
        }
        queue.extend(rx.try_iter());
        // A caller that went away is not computed for.
        queue.retain(|j| !j.reply.is_closed());
        if queue.is_empty() {
            continue;
        }
        // One input from each call in turn, up to the pass's tokens (and at
        // least one input, however long).
        let mut taken: Vec<(usize, usize)> = Vec::new(); // (job, input)
        let mut tokens = 0;
        'fill: loop {
            let mut any = false;
            for (j, job) in queue.iter_mut().enumerate() {
                let Some(input) = job.inputs.get(job.next) else {
                    continue;
                };
                if !taken.is_empty() && tokens + input.len() > pass_tokens {
                    break 'fill;
                }
                tokens += input.len();
                taken.push((j, job.next));
                job.next += 1;
                any = true;
            }
            if !any {
                break;
            }
        }
        let batch: Vec<Tokens> = taken
            .iter()
            .map(|&(j, i)| queue[j].inputs[i].clone())
            .collect();
        let failed = match pass(&batch) {
            Ok(vectors) => {
                for (&(j, _), v) in taken.iter().zip(vectors) {
                    queue[j].vectors.push(v);
                }
                None
            }
            Err(e) => Some(e.to_string()),
        };
        // Answer the calls that are complete (or, when the pass failed,
        // those in it); the rest rotate, so the next pass starts with
        // another call.
        let mut rest = VecDeque::with_capacity(queue.len());
        for (j, job) in queue.drain(..).enumerate() {
            if let Some(why) = &failed
                && taken.iter().any(|&(t, _)| t == j)
            {
                let _ = job.reply.send(Err(EmbedError::Failed(why.clone())));
            } else if job.vectors.len() == job.inputs.len() {
                let _ = job.reply.send(Ok(job.vectors));
            } else {
                rest.push_back(job);
            }
        }
        rest.rotate_left(usize::from(!rest.is_empty()));
        queue = rest;
    }
}
