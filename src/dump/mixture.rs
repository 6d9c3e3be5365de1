//! `minibatchd dump --mixture NAME`: a mixture's minibatches, or its ledger, as JSON lines
//! (`docs/mixtures.md`, "Reading a mixture with dump").
//!
//! The loop is the engine's [`Mixture`]; each minibatch's sequences are gathered per source (the
//! source's chunks parsed in-process when a slot first needs them, dropped when the source's
//! sweep is done with them) and written in slot order.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;
use std::sync::Arc;

use minibatchd_engine::dataset::Dataset;
use minibatchd_engine::format::chunk::ParsedChunk;
use minibatchd_engine::minibatch::gather_mixture;
use minibatchd_engine::sampling::mixture::{
    Mixture, MixtureError, MixtureOptions, MixturePlan, MixtureState, SourceState, MAX_SOURCES, MAX_WALK_SLOTS,
};

use crate::config::mixture::{sources_of, StreamLayout};

use super::{write_streams, DumpError};

/// What `dump --mixture` asks for.
#[derive(Debug, Clone)]
pub struct MixtureDumpOptions {
    /// Weights, epoch, workers and rank.
    pub mixture: MixtureOptions,
    /// Minibatch sizes in samples, cycled.
    pub minibatch_sizes: Vec<usize>,
    /// Stop after this many minibatches.
    pub num_minibatches: Option<u64>,
    /// Start from this state (a `state` a previous line printed).
    pub restore: Option<MixtureState>,
    /// Start at this epoch (`--sweep K`): the epochs before it walked with the first minibatch
    /// size, as a daemon session's `sweep` does; then `restore`, if given.
    pub epoch: Option<u64>,
}

fn mixture_of(datasets: &[Dataset], options: &MixtureDumpOptions) -> Result<Mixture, DumpError> {
    let refs: Vec<&Dataset> = datasets.iter().collect();
    let mut mixture = Mixture::new(&sources_of(&refs), options.mixture.clone())?;
    if let Some(k) = options.epoch {
        let size = options.minibatch_sizes.first().copied().unwrap_or(1);
        mixture.skip_epochs(k, size, MAX_WALK_SLOTS)?;
    }
    if let Some(state) = &options.restore {
        mixture.restore(state)?;
    }
    Ok(mixture)
}

/// Runs the mixture's plans (no data read), calling `each(index, plan)`; returns their number.
fn for_each_plan(
    datasets: &[Dataset],
    options: &MixtureDumpOptions,
    each: &mut dyn FnMut(u64, &MixturePlan) -> Result<(), DumpError>,
) -> Result<u64, DumpError> {
    let mut mixture = mixture_of(datasets, options)?;
    let sizes = if options.minibatch_sizes.is_empty() { vec![1] } else { options.minibatch_sizes.clone() };
    let mut count = 0u64;
    while options.num_minibatches.is_none_or(|n| count < n) {
        let size = sizes[usize::try_from(count % sizes.len() as u64).unwrap_or(0)];
        let Some(plan) = mixture.next_minibatch(size)? else { break };
        each(count, &plan)?;
        count += 1;
    }
    Ok(count)
}

/// Writes the mixture's ledger: per minibatch its index, step, the sources whose sweep ended in
/// it, the fingerprint, `[source, sweep, sequence]` of each of this worker's sequences, and the
/// state after it. No data is read.
///
/// # Errors
/// Invalid options or state, and write errors.
pub fn ledger(datasets: &[Dataset], options: &MixtureDumpOptions, out: &mut dyn Write) -> Result<u64, DumpError> {
    let mut line = String::new();
    let n = for_each_plan(datasets, options, &mut |index, plan| {
        line.clear();
        head(&mut line, index, plan);
        line.push_str(", \"sequences\": [");
        for (i, r) in plan.sequences.iter().enumerate() {
            let _ = write!(line, "{}[{}, {}, {}]", if i > 0 { ", " } else { "" }, r.source, r.sweep, r.seq.seq);
        }
        line.push(']');
        tail(&mut line, &plan.state);
        out.write_all(line.as_bytes())?;
        Ok(())
    })?;
    out.flush()?;
    Ok(n)
}

/// Writes the mixture's minibatches with their data, in the streams of `layout`.
///
/// # Errors
/// Invalid options or state, data errors, and write errors.
pub fn dump(
    datasets: &[Dataset],
    layout: &StreamLayout,
    options: &MixtureDumpOptions,
    out: &mut dyn Write,
) -> Result<u64, DumpError> {
    let mut held: Vec<HashMap<u32, Arc<ParsedChunk>>> = vec![HashMap::new(); datasets.len()];
    let timelines: Vec<&minibatchd_engine::sampling::Timeline> =
        datasets.iter().map(|d| d.timeline().as_ref()).collect();
    let mut line = String::new();
    let n = for_each_plan(datasets, options, &mut |index, plan| {
        for r in &plan.sequences {
            let s = r.source as usize;
            if let std::collections::hash_map::Entry::Vacant(e) = held[s].entry(r.seq.chunk) {
                let (parsed, fresh) = datasets[s].load_chunk(r.seq.chunk as usize)?;
                for m in &fresh {
                    tracing::warn!("{m}");
                }
                e.insert(Arc::new(parsed));
            }
        }
        let mut sources: Vec<&mut dyn minibatchd_engine::minibatch::ChunkSource> =
            held.iter_mut().map(|h| h as &mut dyn minibatchd_engine::minibatch::ChunkSource).collect();
        let g = gather_mixture(index, plan, &layout.shapes, &timelines, &layout.order, &mut sources)?;
        let mb = g.to_minibatch();
        for &(s, c) in &plan.retire {
            held[s as usize].remove(&c);
        }
        line.clear();
        head(&mut line, index, plan);
        line.push_str(", \"sources\": [");
        for (i, r) in plan.sequences.iter().enumerate() {
            let _ = write!(line, "{}{}", if i > 0 { ", " } else { "" }, r.source);
        }
        line.push_str("], ");
        write_streams(&mut line, &mb, &layout.names);
        tail(&mut line, &plan.state);
        out.write_all(line.as_bytes())?;
        Ok(())
    })?;
    out.flush()?;
    Ok(n)
}

fn head(line: &mut String, index: u64, plan: &MixturePlan) {
    let _ = write!(line, "{{\"minibatch\": {index}, \"step\": {}, \"sweeps_ended\": [", plan.step);
    for (i, s) in plan.sweeps_ended.iter().enumerate() {
        let _ = write!(line, "{}{s}", if i > 0 { ", " } else { "" });
    }
    let _ = write!(line, "], \"fingerprint\": \"{:016x}\"", plan.fingerprint());
}

fn tail(line: &mut String, state: &MixtureState) {
    line.push_str(", \"state\": ");
    write_state(line, state);
    line.push_str("}\n");
}

/// Appends `state` as the JSON object `dump` prints and `--restore-state` reads (spaced as the
/// rest of a line).
pub fn write_state(line: &mut String, state: &MixtureState) {
    let _ = write!(
        line,
        "{{\"step\": {}, \"slots\": {}, \"samples\": {}, \"ended\": {}, \"sources\": [",
        state.step, state.slots, state.samples, state.ended
    );
    for (i, s) in state.sources.iter().enumerate() {
        let _ = write!(
            line,
            "{}{{\"position\": {}, \"taken\": {}, \"credit\": {}, \"weight\": {}}}",
            if i > 0 { ", " } else { "" },
            s.position,
            s.taken,
            s.credit,
            s.weight
        );
    }
    line.push_str("]}");
}

/// Reads a mixture state from the JSON object [`write_state`] writes.
///
/// # Errors
/// Text that is not such an object, naming the field.
pub fn parse_state(text: &str) -> Result<MixtureState, MixtureError> {
    let bad = |what: &str| MixtureError::BadState(format!("{what} (expected the \"state\" object a dump line prints)"));
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(&format!("not JSON: {e}")))?;
    let uint = |v: &serde_json::Value, key: &str| {
        v.get(key)
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad(&format!("`{key}` is not an unsigned integer")))
    };
    let sources = v.get("sources").and_then(serde_json::Value::as_array).ok_or_else(|| bad("no `sources` array"))?;
    if sources.is_empty() || sources.len() > MAX_SOURCES {
        return Err(bad(&format!("{} sources: a mixture has 1..={MAX_SOURCES}", sources.len())));
    }
    let mut out = Vec::with_capacity(sources.len());
    for s in sources {
        out.push(SourceState {
            position: uint(s, "position")?,
            taken: uint(s, "taken")?,
            credit: s
                .get("credit")
                .and_then(serde_json::Value::as_i64)
                .ok_or_else(|| bad("`credit` is not an integer"))?,
            weight: uint(s, "weight")?,
        });
    }
    Ok(MixtureState {
        step: uint(&v, "step")?,
        slots: uint(&v, "slots")?,
        samples: uint(&v, "samples")?,
        ended: v.get("ended").and_then(serde_json::Value::as_bool).ok_or_else(|| bad("`ended` is not a boolean"))?,
        sources: out,
    })
}
