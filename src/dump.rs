//! `minibatchd dump`: run a session in-process and print each minibatch as one JSON object per
//! line (the format is `docs/dump.md`). The Python client's `Minibatch.to_dump()` returns the same object, so the
//! daemon's output can be compared with this one for equality.
//!
//! Numbers print with the shortest representation that round-trips the stored precision (f32 or
//! f64). Non-finite values (`1e400` parses to infinity in CNTK's grammar) print as `Infinity`,
//! `-Infinity` and `NaN`, which Python's `json` module reads back.
//!
//! Only the chunks a plan references are parsed, and each is dropped as soon as the sampler
//! retires it, so memory stays bounded by the randomization window, not the dataset: the loop is
//! the engine's [`Feeder`], the same the daemon's producer runs.

use std::io::Write;
use std::sync::Arc;

use minibatchd_engine::dataset::Dataset;
use minibatchd_engine::feed::Feeder;
use minibatchd_engine::format::chunk::ParsedChunk;
use minibatchd_engine::format::errors::DataError;
use minibatchd_engine::minibatch::{MbData, MbStream, MbValues as Values, Minibatch};
use minibatchd_engine::sampling::{MinibatchPlan, Sampler, SamplingOptions, Tail};
use minibatchd_shm::Indices;

pub mod mixture;

/// What `dump` (or a session) asks for besides the sampling options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpOptions {
    /// Sampling: randomization, window, seed, epoch limit, workers.
    pub sampling: SamplingOptions,
    /// Minibatch sizes in samples, cycled: minibatch `i` uses entry `i % len`.
    pub minibatch_sizes: Vec<usize>,
    /// Stop after this many minibatches.
    pub num_minibatches: Option<u64>,
    /// Start at this checkpoint position.
    pub restore: Option<u64>,
    /// Mid-run restores: before minibatch `i` (counted from 0 over the whole run), restore the
    /// sampler to position `p`, as a trainer that calls `restore_from_checkpoint` between two
    /// `next_minibatch` calls. The minibatch sizes keep cycling by `i`.
    pub restore_before: Vec<(u64, u64)>,
    /// Equal step counts over the workers (one minibatch size only).
    pub equal_steps: bool,
    /// With equal steps, what the workers' ragged tails become: dropped, or padded with empty
    /// minibatches up to the count of the worker that gets the most (as the session option).
    pub tail: Tail,
    /// CNTK frame mode: every sequence must have one sample.
    pub frame_mode: bool,
}

/// Why `dump` failed.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// Reading data failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The sampling options are invalid.
    #[error(transparent)]
    Sampling(#[from] minibatchd_engine::sampling::SamplingError),
    /// The mixture's options, state or sources are invalid.
    #[error(transparent)]
    MixtureOptions(#[from] minibatchd_engine::sampling::mixture::MixtureError),
    /// The mixture's datasets cannot be dumped together.
    #[error("{0}")]
    Mixture(String),
    /// Writing the output failed.
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

/// Runs the session described by `options` over `dataset`, calling `each` per minibatch.
///
/// Chunks are parsed in-process when a plan first needs them and dropped when the sampler retires
/// them ([`Feeder`], the loop the daemon's producer runs too). Returns the number of minibatches,
/// and the most chunks and parsed bytes held at once.
///
/// # Errors
/// Invalid options, data errors, or the first error `each` returns.
pub fn for_each_minibatch(
    dataset: &Dataset,
    options: &DumpOptions,
    each: &mut dyn FnMut(&Minibatch) -> Result<(), DumpError>,
) -> Result<(u64, usize, usize), DumpError> {
    let mut feeder = new_feeder(dataset, options)?;
    let mut load = |chunk: u32| -> Result<Arc<ParsedChunk>, DataError> {
        let (parsed, fresh) = dataset.load_chunk(chunk as usize)?;
        for e in &fresh {
            tracing::warn!("{e}");
        }
        Ok(Arc::new(parsed))
    };
    let count = walk(options, &mut |step| match step {
        Step::Restore(position) => Ok(feeder.restore(position).map(|()| true)?),
        Step::Next(size) => {
            let Some(plan) = feeder.plan(size) else { return Ok(false) };
            let gathered = feeder.gather(&plan, &mut load).map_err(|e| dataset.locate(e))?;
            each(&gathered.to_minibatch())?;
            Ok(true)
        }
    })?;
    Ok((count, feeder.peak_chunks(), feeder.peak_bytes()))
}

/// Walks the session's plans (no data is read), calling `each(index, plan)` per minibatch:
/// restores, minibatch sizes, equal steps and the minibatch limit as `options` say. Returns the
/// number of minibatches.
///
/// # Errors
/// Invalid options, or the first error `each` returns.
pub fn for_each_plan(
    dataset: &Dataset,
    options: &DumpOptions,
    each: &mut dyn FnMut(u64, &MinibatchPlan) -> Result<(), DumpError>,
) -> Result<u64, DumpError> {
    // The feeder plans as the daemon's producer does (padding included) and reads no data
    // until asked to gather, which this never does.
    let mut feeder = new_feeder(dataset, options)?;
    let mut index = 0u64;
    walk(options, &mut |step| match step {
        Step::Restore(position) => Ok(feeder.restore(position).map(|()| true)?),
        Step::Next(size) => {
            let Some(plan) = feeder.plan(size) else { return Ok(false) };
            each(index, &plan)?;
            index += 1;
            Ok(true)
        }
    })
}

/// The session's feeder: equal steps (padded as `options.tail` says) and the starting position
/// applied to its sampler.
fn new_feeder(dataset: &Dataset, options: &DumpOptions) -> Result<Feeder, DumpError> {
    let mut sampler = Sampler::new(dataset.timeline().clone(), options.sampling.clone())?;
    let mut pad_to = None;
    if options.equal_steps {
        let size = options.minibatch_sizes.first().copied().unwrap_or(1);
        let equal = sampler.equalize_steps(size, options.tail)?;
        if let Some(w) = equal.drop_warning(&sampler, size, options.tail) {
            // What the session's `opened.warnings` says, on standard error.
            tracing::warn!("{w}");
        }
        if options.tail == Tail::Pad {
            pad_to = Some(equal.steps);
        }
    }
    if let Some(p) = options.restore {
        // A position past the epoch's end yields nothing, as CNTK 2.7's restore does (its parity
        // corpus holds such cold restores); a session refuses such a state instead.
        sampler.restore(p)?;
        if let Some(steps) = pad_to {
            // The padding fills the epoch to `steps` minibatches counted from its start, as a
            // resumed session counts them from its state's (found by a probe: counted from the
            // restore, the dump printed a whole epoch's padding again). This worker's minibatches
            // before `p`, walked without data.
            let mut walker = Sampler::new(dataset.timeline().clone(), options.sampling.clone())?;
            let mut before = 0u64;
            while walker.position() < p {
                if walker.next_minibatch(size_of_minibatch(options, before)).is_none() {
                    break;
                }
                before += 1;
            }
            pad_to = Some(steps.saturating_sub(before));
        }
    }
    let mut feeder = Feeder::new(sampler, dataset.timeline().clone(), dataset.stream_shapes(), options.frame_mode, 0);
    if let Some(end) = pad_to {
        feeder.pad_to(end);
    }
    Ok(feeder)
}

/// The size of minibatch `index` of a dump: `options.minibatch_sizes` cycled (1 when none).
fn size_of_minibatch(options: &DumpOptions, index: u64) -> usize {
    let sizes = &options.minibatch_sizes;
    usize::try_from(index % (sizes.len().max(1) as u64)).ok().and_then(|i| sizes.get(i).copied()).unwrap_or(1)
}

/// One step of a dump's schedule.
enum Step {
    /// Restore the sampler to this position (a trainer's mid-run restore).
    Restore(u64),
    /// Produce the next minibatch of this size; `false` at the end of the epoch.
    Next(usize),
}

/// The schedule of a dump: before minibatch `i`, the restores `options` asks for; then the next
/// minibatch with the cycled size, until `step` returns `false` or the minibatch limit.
fn walk(options: &DumpOptions, step: &mut dyn FnMut(Step) -> Result<bool, DumpError>) -> Result<u64, DumpError> {
    let mut count = 0u64;
    while options.num_minibatches.is_none_or(|n| count < n) {
        for &(_, p) in options.restore_before.iter().filter(|&&(i, _)| i == count) {
            step(Step::Restore(p))?;
        }
        if !step(Step::Next(size_of_minibatch(options, count)))? {
            break;
        }
        count += 1;
    }
    Ok(count)
}

/// Writes the session's data-order ledger to `out`, one JSON object per minibatch: `minibatch`,
/// `sweep`, `end_of_sweep`, `position`, `fingerprint` (as in `dump` and in the slot header),
/// `sequences`, the global file-order indices of its sequences, and — for a minibatch that
/// crosses sweep ends — `next_sweeps_at`, where in `sequences` each later sweep begins. No data
/// is read.
///
/// # Errors
/// As [`for_each_plan`], and write errors.
pub fn ledger(dataset: &Dataset, options: &DumpOptions, out: &mut dyn Write) -> Result<u64, DumpError> {
    use std::fmt::Write as _;
    let mut line = String::new();
    let lengths = &dataset.timeline().seq_len;
    let n = for_each_plan(dataset, options, &mut |index, plan| {
        // Frame mode fails where the data would (found by a probe: the ledger printed the
        // minibatches a `--frame-mode` session never gets). The ledger reads no data: a sequence's
        // nominal length is what it knows.
        if options.frame_mode {
            if let Some(r) = plan.sequences.iter().find(|r| lengths.samples(r.seq as usize..=r.seq as usize) > 1) {
                let samples = lengths.samples(r.seq as usize..=r.seq as usize);
                let e = DataError::NonFrame { seq: u64::from(r.seq), chunk: r.chunk, samples, stream: None };
                return Err(DumpError::Data(dataset.locate(e)));
            }
        }
        line.clear();
        let _ = write!(
            line,
            "{{\"minibatch\": {index}, \"sweep\": {}, \"end_of_sweep\": {}, \"position\": {}, \"fingerprint\": \"{:016x}\", \"sequences\": [",
            plan.sweep,
            plan.end_of_sweep,
            plan.position,
            plan.fingerprint()
        );
        for (i, r) in plan.sequences.iter().enumerate() {
            let _ = write!(line, "{}{}", if i > 0 { ", " } else { "" }, r.seq);
        }
        line.push(']');
        if !plan.next_sweeps_at.is_empty() {
            // Where each later sweep's sequences begin, in a minibatch that crosses sweep ends.
            line.push_str(", \"next_sweeps_at\": [");
            for (i, at) in plan.next_sweeps_at.iter().enumerate() {
                let _ = write!(line, "{}{at}", if i > 0 { ", " } else { "" });
            }
            line.push(']');
        }
        line.push_str("}\n");
        out.write_all(line.as_bytes())?;
        Ok(())
    })?;
    out.flush()?;
    Ok(n)
}

/// Writes every minibatch of the session to `out` as JSON lines.
///
/// # Errors
/// As [`for_each_minibatch`].
pub fn dump(dataset: &Dataset, options: &DumpOptions, out: &mut dyn Write) -> Result<u64, DumpError> {
    let names = dataset.stream_names().to_vec();
    let mut line = String::new();
    let (n, _, _) = for_each_minibatch(dataset, options, &mut |mb| {
        line.clear();
        write_json(&mut line, mb, &names);
        line.push('\n');
        out.write_all(line.as_bytes())?;
        Ok(())
    })?;
    out.flush()?;
    Ok(n)
}

/// Appends the `docs/dump.md` JSON object of `mb` (without a newline) to `out`.
pub fn write_json(out: &mut String, mb: &Minibatch, names: &[String]) {
    use std::fmt::Write as _;
    let _ = write!(
        out,
        "{{\"minibatch\": {}, \"sweep\": {}, \"end_of_sweep\": {}, \"position\": {}, \"fingerprint\": \"{:016x}\", ",
        mb.index, mb.sweep, mb.end_of_sweep, mb.position, mb.fingerprint
    );
    write_streams(out, mb, names);
    out.push('}');
}

/// Appends `"streams": {...}`, the streams of `mb` named `names`.
fn write_streams(out: &mut String, mb: &Minibatch, names: &[String]) {
    use std::fmt::Write as _;
    out.push_str("\"streams\": {");
    for (i, (name, s)) in names.iter().zip(&mb.streams).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_str(out, name);
        let _ = write!(
            out,
            ": {{\"num_samples\": {}, \"num_sequences\": {}, \"sequences\": [",
            s.num_samples(),
            s.num_sequences()
        );
        write_sequences(out, s);
        out.push_str("]}");
    }
    out.push('}');
}

/// An offset of a minibatch as an index (offsets are non-negative and index in-memory arrays).
fn at(offset: i64) -> usize {
    usize::try_from(offset).unwrap_or(0)
}

fn write_sequences(out: &mut String, s: &MbStream) {
    for q in 0..s.num_sequences() {
        if q > 0 {
            out.push_str(", ");
        }
        out.push('[');
        let (a, b) = (at(s.sequence_offsets[q]), at(s.sequence_offsets[q + 1]));
        for j in a..b {
            if j > a {
                out.push_str(", ");
            }
            match &s.data {
                MbData::Dense { dim, values } => {
                    out.push('[');
                    write_values(out, values, j * dim..(j + 1) * dim);
                    out.push(']');
                }
                MbData::Sparse { sample_offsets, indices, values, .. } => {
                    let (e0, e1) = (at(sample_offsets[j]), at(sample_offsets[j + 1]));
                    out.push_str("{\"indices\": [");
                    write_indices(out, indices, e0..e1);
                    out.push_str("], \"values\": [");
                    write_values(out, values, e0..e1);
                    out.push_str("]}");
                }
                MbData::Strings { offsets, bytes } => write_bytes(out, &bytes[at(offsets[j])..at(offsets[j + 1])]),
            }
        }
        out.push(']');
    }
}

fn write_indices(out: &mut String, indices: &Indices, range: std::ops::Range<usize>) {
    use std::fmt::Write as _;
    for (k, i) in range.enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        let _ = match indices {
            Indices::I32(v) => write!(out, "{}", v[i]),
            Indices::U64(v) => write!(out, "{}", v[i]),
        };
    }
}

fn write_values(out: &mut String, values: &Values, range: std::ops::Range<usize>) {
    let mut buf = ryu::Buffer::new();
    for (k, i) in range.enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        match values {
            Values::F32(v) if v[i].is_finite() => out.push_str(buf.format_finite(v[i])),
            Values::F64(v) if v[i].is_finite() => out.push_str(buf.format_finite(v[i])),
            _ => out.push_str(non_finite(values.get_f64(i))),
        }
    }
}

fn non_finite(x: f64) -> &'static str {
    if x.is_nan() {
        "NaN"
    } else if x > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    }
}

/// A strings sample: a JSON string when its bytes are UTF-8, else `{"hex": "…"}` — every byte
/// as two lowercase hex digits, so that no byte is lost or replaced.
fn write_bytes(out: &mut String, b: &[u8]) {
    use std::fmt::Write as _;
    if let Ok(text) = std::str::from_utf8(b) {
        write_str(out, text);
    } else {
        out.push_str("{\"hex\": \"");
        for byte in b {
            let _ = write!(out, "{byte:02x}");
        }
        out.push_str("\"}");
    }
}

fn write_str(out: &mut String, s: &str) {
    out.push_str(&serde_json::Value::String(s.to_owned()).to_string());
}
