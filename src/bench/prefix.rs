//! `bulkhead bench prefix`: what the prefix cache saves a multi-turn chat.
//! Two engines in this process, one with the cache and one without, serve
//! the same ten-turn chat whose history grows every turn (each turn's
//! prompt is the whole conversation so far, as chat clients send it; the
//! assistant's replies are the model's own, generated once). Each turn's
//! time to first token is measured on both, alternately, over several
//! chats (each in a fresh namespace, so turn 1 is always cold), and the
//! median per turn is reported with the ratio off/on. Decode throughput is
//! measured on both too (the same short prompt, tokens/s after the first),
//! so a cache that slowed decoding would show.
//!
//! `--fleet` measures the same chat through a platform with several
//! workers instead, with prefix-aware routing on and off ([`super::fleet`]).

use crate::config::ModelArgs;
use anyhow::{Context, bail};
use bulkhead_engine::{
    CacheScope, ChatMessage, Engine, GenerateRequest, Namespace, SamplingParams, SeqEvent,
};
use bulkhead_kv::TenantId;
use clap::Args;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub(crate) struct PrefixBenchArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Turns per chat.
    #[arg(long, default_value_t = 10)]
    turns: usize,
    /// Chats (each in a fresh namespace); medians are taken over them.
    #[arg(long, default_value_t = 3)]
    chats: usize,
    /// Tokens of each assistant reply.
    #[arg(long, default_value_t = 48)]
    reply_tokens: usize,
    /// Tokens generated in the decode-throughput runs.
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    /// Decode-throughput runs on each engine (in pairs, alternating; the
    /// machine's noise is about 2 % with fewer than 30).
    #[arg(long, default_value_t = 31)]
    decode_pairs: usize,
    /// Through `bulkhead up` with `--fleet-workers` colocated workers,
    /// prefix affinity on against off (turn-by-turn TTFT at the gateway).
    #[arg(long)]
    fleet: bool,
    /// Workers of the `--fleet` platform.
    #[arg(long, default_value_t = 2)]
    fleet_workers: u8,
    #[command(flatten)]
    model: ModelArgs,
}

pub(crate) fn run(args: &PrefixBenchArgs) -> anyhow::Result<()> {
    if args.turns == 0 || args.chats == 0 {
        bail!("--turns and --chats must be at least 1");
    }
    if args.fleet {
        return super::fleet::run(&super::fleet::FleetArgs {
            turns: args.turns,
            chats: args.chats,
            reply_tokens: args.reply_tokens,
            workers: args.fleet_workers,
            json: args.json,
        });
    }
    let model = Arc::new(args.model.load()?.0);
    let mut config = args.model.engine_config();
    config.prefix_cache = true;
    let on = Engine::start(Arc::clone(&model), &config)?;
    config.prefix_cache = false;
    let off = Engine::start(Arc::clone(&model), &config)?;

    let prompts = conversation(&off, args.turns, args.reply_tokens)?;
    let window = on
        .info()
        .limits
        .context_window()
        .min(on.info().limits.pool_tokens());
    if let Some(last) = prompts.last()
        && last.len() + 1 > window
    {
        bail!(
            "the {}-turn chat ({} tokens) does not fit the {window}-token window",
            args.turns,
            last.len()
        );
    }
    let ttft = ttft_by_turn(&on, &off, &prompts, args)?;
    let (decode_on, decode_off, decode_ratio) = decode_both(&on, &off, &prompts[0], args)?;
    let hit_tokens = on.stats().map_or(0, |s| s.pool.prefix_hit_tokens);

    let rows: Vec<_> = ttft
        .iter()
        .enumerate()
        .map(|(i, (a, b))| {
            let (on_ms, off_ms) = (median_ms(a), median_ms(b));
            (i + 1, prompts[i].len(), on_ms, off_ms, off_ms / on_ms)
        })
        .collect();
    let last = rows.last().map_or(0.0, |r| r.4);
    if args.json {
        let turns: Vec<_> = rows
            .iter()
            .map(|(turn, tokens, on_ms, off_ms, ratio)| {
                json!({"turn": turn, "prompt_tokens": tokens, "ttft_on_ms": on_ms,
                       "ttft_off_ms": off_ms, "speedup": ratio})
            })
            .collect();
        println!(
            "{}",
            json!({
                "turns": turns,
                "last_turn_speedup": last,
                "decode_tokens_per_s_on": decode_on,
                "decode_tokens_per_s_off": decode_off,
                "decode_ratio_on_off": decode_ratio,
                "prefix_hit_tokens": hit_tokens,
                "chats": args.chats,
            })
        );
    } else {
        println!("turn  prompt  TTFT cache on  TTFT cache off  off/on");
        for (turn, tokens, on_ms, off_ms, ratio) in &rows {
            println!("{turn:>4}  {tokens:>6}  {on_ms:>10.1} ms  {off_ms:>11.1} ms  {ratio:>5.2}x");
        }
        println!(
            "turn {}: {last:.2}x faster with the cache (target: at least 5x)",
            rows.len()
        );
        println!(
            "decode: {decode_on:.1} tokens/s with the cache, {decode_off:.1} without ({:+.2} %; target: within 2 %)",
            (decode_ratio - 1.0) * 100.0
        );
    }
    Ok(())
}

/// Each turn's time-to-first-token samples, cache on and off.
#[allow(clippy::type_complexity)]
fn ttft_by_turn(
    on: &Engine,
    off: &Engine,
    prompts: &[Vec<u32>],
    args: &PrefixBenchArgs,
) -> anyhow::Result<Vec<(Vec<Duration>, Vec<Duration>)>> {
    let mut ttft: Vec<(Vec<Duration>, Vec<Duration>)> = vec![Default::default(); args.turns];
    for chat in 0..args.chats {
        let scope = CacheScope::new(namespace(chat), None);
        for (turn, prompt) in prompts.iter().enumerate() {
            // Alternate which engine goes first, so drift hits both alike.
            let order = if (chat + turn) % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for cached in order {
                let (engine, cache) = if cached {
                    (on, Some(scope))
                } else {
                    (off, None)
                };
                // The turn's full request: the reply is generated too, so
                // the cache holds what a real chat leaves behind.
                let t = first_token(engine, prompt.clone(), args.reply_tokens, cache)?;
                let slot = &mut ttft[turn];
                if cached {
                    slot.0.push(t)
                } else {
                    slot.1.push(t)
                }
            }
        }
    }
    Ok(ttft)
}

/// Decode tokens/s with the cache and without, and the median of the
/// pairs' ratios.
fn decode_both(
    on: &Engine,
    off: &Engine,
    prompt: &[u32],
    args: &PrefixBenchArgs,
) -> anyhow::Result<(f64, f64, f64)> {
    // Interleaved, so drift hits both alike; the cached engine's requests
    // carry a scope (and reuse the prompt from the second run on).
    // Pairs in alternating order; the ratio is the median of the pairs'.
    let (mut rates_on, mut rates_off, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let decode_scope = CacheScope::new(namespace(usize::MAX), None);
    for pair in 0..args.decode_pairs.max(1) {
        let one = |cached: bool| {
            if cached {
                decode_rate(on, prompt, args.decode_tokens, Some(decode_scope))
            } else {
                decode_rate(off, prompt, args.decode_tokens, None)
            }
        };
        let (a, b) = if pair % 2 == 0 {
            let a = one(true)?;
            (a, one(false)?)
        } else {
            let b = one(false)?;
            (one(true)?, b)
        };
        rates_on.push(a);
        rates_off.push(b);
        ratios.push(a / b);
    }
    Ok((median(rates_on), median(rates_off), median(ratios)))
}

/// A namespace of the bench's own (the platform derives real ones).
fn namespace(chat: usize) -> Namespace {
    let mut d = [0x5a; 16];
    d[..8].copy_from_slice(&(chat as u64).to_le_bytes());
    Namespace::from_digest(d)
}

/// The prompts of each turn of one chat: the whole conversation so far
/// and the turn's question, rendered by the model's template. The
/// assistant's replies are the model's greedy answers.
fn conversation(
    engine: &Engine,
    turns: usize,
    reply_tokens: usize,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let template = engine
        .model()
        .chat_template()
        .context("the model has no chat template")?;
    let questions = [
        "What is a harbor used for?",
        "Why do orchards need bees?",
        "How is a library organised?",
        "What makes a glacier move?",
        "What can you buy at a market?",
        "What does an observatory study?",
        "How are canyons formed?",
        "What tools are in a workshop?",
        "Why do rivers bend?",
        "What lives in a tide pool?",
    ];
    let mut messages = vec![ChatMessage {
        role: "system".into(),
        content: "You are a helpful assistant. Answer in two or three sentences.".into(),
    }];
    let mut prompts = Vec::with_capacity(turns);
    for turn in 0..turns {
        messages.push(ChatMessage {
            role: "user".into(),
            content: questions[turn % questions.len()].into(),
        });
        let text = template.render(&messages).context("rendering the chat")?;
        let prompt = engine.tokenizer().encode(&text)?;
        let reply = answer(engine, prompt.clone(), reply_tokens)?;
        prompts.push(prompt);
        messages.push(ChatMessage {
            role: "assistant".into(),
            content: reply,
        });
    }
    Ok(prompts)
}

fn request(prompt: Vec<u32>, max_tokens: usize, cache: Option<CacheScope>) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams::greedy(max_tokens),
        stop: Vec::new(),
        ignore_eos: false,
        cache,
        class: bulkhead_engine::WorkClass::Interactive,
    }
}

fn answer(engine: &Engine, prompt: Vec<u32>, max_tokens: usize) -> anyhow::Result<String> {
    let mut h = engine.submit(TenantId::new(1), request(prompt, max_tokens, None))?;
    let mut text = String::new();
    while let Some(ev) = h.blocking_next() {
        match ev {
            SeqEvent::Token { text: t, .. } => text.push_str(&t),
            SeqEvent::Finished { text: t, .. } => {
                text.push_str(&t);
                return Ok(text);
            }
            SeqEvent::Failed(e) => bail!("the reply failed: {e}"),
        }
    }
    bail!("the engine stopped")
}

/// Submission to first token, then the rest of the answer drained.
fn first_token(
    engine: &Engine,
    prompt: Vec<u32>,
    max_tokens: usize,
    cache: Option<CacheScope>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut h = engine.submit(TenantId::new(1), request(prompt, max_tokens, cache))?;
    let mut first = None;
    while let Some(ev) = h.blocking_next() {
        match ev {
            SeqEvent::Token { .. } => {
                first.get_or_insert_with(|| start.elapsed());
            }
            SeqEvent::Finished { .. } => {
                return Ok(first.unwrap_or_else(|| start.elapsed()));
            }
            SeqEvent::Failed(e) => bail!("a turn failed: {e}"),
        }
    }
    bail!("the engine stopped")
}

/// Tokens per second after the first token of one run.
fn decode_rate(
    engine: &Engine,
    prompt: &[u32],
    tokens: usize,
    cache: Option<CacheScope>,
) -> anyhow::Result<f64> {
    let mut req = request(prompt.to_vec(), tokens, cache);
    req.ignore_eos = true;
    let mut h = engine.submit(TenantId::new(2), req)?;
    let (mut first, mut n) = (None, 0usize);
    while let Some(ev) = h.blocking_next() {
        match ev {
            SeqEvent::Token { .. } => {
                n += 1;
                first.get_or_insert_with(Instant::now);
            }
            SeqEvent::Finished { .. } => break,
            SeqEvent::Failed(e) => bail!("a decode run failed: {e}"),
        }
    }
    let elapsed = first.map_or(Duration::ZERO, |f| f.elapsed()).as_secs_f64();
    if n < 2 || elapsed <= 0.0 {
        bail!("a decode run produced {n} tokens");
    }
    Ok((n - 1) as f64 / elapsed)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn median_ms(xs: &[Duration]) -> f64 {
    let mut v: Vec<f64> = xs.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
