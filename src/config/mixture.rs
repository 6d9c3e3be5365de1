//! `[mixtures.NAME]`: a weighted mixture of configured datasets (`docs/mixtures.md`).
//!
//! ```toml
//! [mixtures.blend]
//! datasets = ["web", "books"]
//! weights = [3, 1]
//! epoch = "first_sweep_end"        # or "endless" (the default), or max_samples = N
//! [[mixtures.blend.schedule]]
//! from_step = 1000
//! weights = [1, 1]
//! ```

use std::collections::BTreeMap;

use minibatchd_engine::dataset::Dataset;
use minibatchd_engine::minibatch::StreamShape;
use minibatchd_engine::sampling::mixture::{
    MixtureEpoch, MixtureSource, WeightSchedule, WeightStage, Weights, MAX_SOURCES,
};
use serde_json::Value;

use super::walk::{Node, Walker};
use super::DatasetConfig;

/// A validated `[mixtures.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixtureConfig {
    /// The datasets mixed, in source order (source `i` is `datasets[i]`).
    pub datasets: Vec<String>,
    /// The weights by step: `weights` from step 0, then each `[[schedule]]` stage.
    pub schedule: WeightSchedule,
    /// When an epoch ends.
    pub epoch: MixtureEpoch,
    /// `[mixtures.NAME.streams]`: each stream of the mixture (by name, in name order) and the
    /// stream of each dataset (in `datasets` order) that fills it. Empty: the streams of the first
    /// dataset, which every dataset has under the same names.
    pub streams: BTreeMap<String, Vec<String>>,
}

/// Reads every `[mixtures.NAME]`; `datasets` are the valid datasets (a mixture naming one that
/// is missing or invalid is an issue).
pub(crate) fn parse_mixtures(
    w: &mut Walker,
    node: &Node<'_>,
    datasets: &BTreeMap<String, DatasetConfig>,
    dataset_names: &[String],
) -> BTreeMap<String, MixtureConfig> {
    let mut out = BTreeMap::new();
    let Some(mut t) = w.table(node) else { return out };
    for (name, n) in t.drain() {
        if dataset_names.contains(&name) {
            w.issue(n.path(), &format!("'{name}' names a dataset too: clients open datasets and mixtures by one name"));
            continue;
        }
        if let Some(m) = parse_mixture(w, &n, datasets, dataset_names) {
            out.insert(name, m);
        }
    }
    w.finish(t);
    out
}

fn parse_mixture(
    w: &mut Walker,
    node: &Node<'_>,
    datasets: &BTreeMap<String, DatasetConfig>,
    dataset_names: &[String],
) -> Option<MixtureConfig> {
    let mut t = w.table(node)?;
    // The datasets listed, valid or not: the weights' count is checked against it even when a
    // name is wrong (found by a probe: `validate` left out a count that did not match beside the
    // list's other problems).
    let mut listed = None;
    let names = if let Some(n) = t.take("datasets") {
        listed = n.json().and_then(Value::as_array).map(Vec::len);
        dataset_list(w, &n, datasets, dataset_names)
    } else {
        w.issue(&t.key_path("datasets"), "required: the datasets mixed, as an array of their names");
        None
    };
    let sources = names.as_ref().map(Vec::len).or(listed);
    let first = if let Some(n) = t.take("weights") {
        weights(w, &n, sources)
    } else {
        w.issue(&t.key_path("weights"), "required: one weight (a number ≥ 0) per dataset");
        None
    };
    let mut stages = first.map(|weights| vec![WeightStage { from_step: 0, weights }]);
    if let Some(n) = t.take("schedule") {
        for (i, item) in w.array(&n).unwrap_or_default().into_iter().enumerate() {
            let Some(mut s) = w.table(&item) else {
                stages = None;
                continue;
            };
            let from = s.uint(w, "from_step", 1, u64::MAX);
            if from.is_none() && !s.had("from_step") {
                w.issue(&s.key_path("from_step"), "required: the first step (minibatch, from 0) these weights fill");
            }
            let ws = if let Some(wn) = s.take("weights") {
                weights(w, &wn, sources)
            } else {
                w.issue(&s.key_path("weights"), "required: one weight per dataset");
                None
            };
            w.finish(s);
            match (from, ws, stages.as_mut()) {
                (Some(from_step), Some(_), Some(v)) if v.last().is_some_and(|l| l.from_step >= from_step) => {
                    w.issue(
                        item.path(),
                        &format!("stage {i} starts at step {from_step}: the stages' steps must increase"),
                    );
                    stages = None;
                }
                (Some(from_step), Some(weights), Some(v)) => v.push(WeightStage { from_step, weights }),
                _ => stages = None,
            }
        }
    }
    let streams = match t.take("streams") {
        Some(n) => stream_map(w, &n, names.as_ref().map(Vec::len)),
        None => Some(BTreeMap::new()),
    };
    let epoch_name = t.string(w, "epoch");
    let max_samples = t.uint(w, "max_samples", 1, u64::MAX / 2);
    let epoch = match (epoch_name.as_deref(), max_samples) {
        (Some(_), Some(_)) => {
            w.issue(&t.key_path("max_samples"), "give `epoch` or `max_samples`, not both");
            None
        }
        (None, Some(n)) => Some(MixtureEpoch::Samples(n)),
        (None | Some("endless"), None) => Some(MixtureEpoch::Endless),
        (Some("first_sweep_end"), None) => Some(MixtureEpoch::FirstSweepEnd),
        (Some(other), None) => {
            w.issue(&t.key_path("epoch"), &format!("'{other}': expected \"endless\" or \"first_sweep_end\""));
            None
        }
    };
    w.finish(t);
    let schedule = match WeightSchedule::new(stages?) {
        Ok(s) => s,
        Err(e) => {
            w.issue(node.path(), &e.to_string());
            return None;
        }
    };
    let (datasets_mixed, streams) = (names?, streams?);
    if let Err(e) = check_streams(&datasets_mixed, datasets, &streams) {
        w.issue(node.path(), &e);
        return None;
    }
    Some(MixtureConfig { datasets: datasets_mixed, schedule, epoch: epoch?, streams })
}

fn dataset_list(
    w: &mut Walker,
    node: &Node<'_>,
    datasets: &BTreeMap<String, DatasetConfig>,
    dataset_names: &[String],
) -> Option<Vec<String>> {
    let items = w.array(node)?;
    if items.is_empty() || items.len() > MAX_SOURCES {
        w.issue(node.path(), &format!("expected 1..={MAX_SOURCES} dataset names, found {}", items.len()));
        return None;
    }
    let mut names = Vec::new();
    let mut ok = true;
    for item in &items {
        match item.json() {
            Some(Value::String(s)) if names.contains(s) => {
                w.issue(item.path(), &format!("'{s}' is listed twice: a dataset is one source of a mixture"));
                ok = false;
            }
            Some(Value::String(s)) if datasets.contains_key(s) => names.push(s.clone()),
            Some(Value::String(s)) if dataset_names.contains(s) => {
                // Its own issues are reported under `datasets.NAME`.
                ok = false;
            }
            Some(Value::String(s)) => {
                w.issue(item.path(), &format!("no dataset '{s}' is configured (known: {})", dataset_names.join(", ")));
                ok = false;
            }
            _ => {
                w.issue(item.path(), "expected a dataset's name (a string)");
                ok = false;
            }
        }
    }
    ok.then_some(names)
}

fn weights(w: &mut Walker, node: &Node<'_>, sources: Option<usize>) -> Option<Weights> {
    let items = w.array(node)?;
    let mut values = Vec::with_capacity(items.len());
    for item in &items {
        let Some(v) = item.json().and_then(Value::as_f64) else {
            w.issue(item.path(), "expected a number ≥ 0");
            return None;
        };
        values.push(v);
    }
    let counted = sources.is_none_or(|n| values.len() == n);
    if let Some(n) = sources.filter(|_| !counted) {
        w.issue(node.path(), &format!("{} weights for {n} datasets", values.len()));
    }
    let weights = Weights::new(&values).map_err(|e| w.issue(node.path(), &e.to_string())).ok();
    weights.filter(|_| counted)
}

/// `[mixtures.NAME.streams]`: `common = ["stream of dataset 0", "stream of dataset 1", ...]`.
fn stream_map(w: &mut Walker, node: &Node<'_>, sources: Option<usize>) -> Option<BTreeMap<String, Vec<String>>> {
    let mut t = w.table(node)?;
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (name, n) in t.drain() {
        let items = w.array(&n).unwrap_or_default();
        let names: Vec<String> =
            items.iter().filter_map(|i| i.json().and_then(Value::as_str).map(str::to_owned)).collect();
        if names.len() != items.len() || items.is_empty() {
            w.issue(n.path(), "expected an array of stream names, one per dataset of the mixture");
            ok = false;
            continue;
        }
        if let Some(k) = sources.filter(|&k| k != names.len()) {
            w.issue(n.path(), &format!("{} stream names for {k} datasets", names.len()));
            ok = false;
            continue;
        }
        out.insert(name, names);
    }
    w.finish(t);
    // A dataset's stream fills one stream of the mixture at most.
    if let Some(k) = sources {
        for source in 0..k {
            let mut used: Vec<&str> = out.values().filter_map(|v| v.get(source).map(String::as_str)).collect();
            used.sort_unstable();
            if let Some(twice) = used.windows(2).find_map(|p| (p[0] == p[1]).then_some(p[0])) {
                w.issue(node.path(), &format!("stream '{twice}' of dataset {source} fills two streams of the mixture"));
                ok = false;
            }
        }
    }
    if out.is_empty() && ok {
        w.issue(node.path(), "no stream: map at least one, or leave the table out to use the datasets' own streams");
        ok = false;
    }
    ok.then_some(out)
}

/// The sources of a mixture of `datasets` (in source order), each sampled by its own dataset's
/// `[sampling]` table.
#[must_use]
pub fn sources_of(datasets: &[&Dataset]) -> Vec<MixtureSource> {
    datasets
        .iter()
        .map(|d| MixtureSource {
            timeline: d.timeline().clone(),
            randomize: d.config().sampling.randomize,
            window: d.config().sampling.window,
            seed: d.config().sampling.seed,
        })
        .collect()
}

/// How a mixture's streams come from its datasets' streams: the mixture's stream names and
/// shapes, and for each dataset the index of its stream that fills each of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamLayout {
    /// The mixture's streams, in order.
    pub names: Vec<String>,
    /// Their shapes (every dataset's stream has the same).
    pub shapes: Vec<minibatchd_engine::minibatch::StreamShape>,
    /// Per dataset, per mixture stream: the dataset's stream index.
    pub order: Vec<Vec<usize>>,
}

/// The mixture's stream layout: `map` (`[mixtures.NAME.streams]`), or when it is empty the first
/// dataset's streams, looked up by name in every dataset.
///
/// # Errors
/// A message: a stream a dataset does not have, or datasets whose streams filling one mixture stream differ
/// in kind, dimension or precision — naming the stream and the datasets.
pub fn stream_layout(
    names_of_datasets: &[String],
    datasets: &[&Dataset],
    map: &BTreeMap<String, Vec<String>>,
) -> Result<StreamLayout, String> {
    let streams: Vec<DatasetStreams> = datasets
        .iter()
        .map(|d| DatasetStreams { names: d.stream_names().to_vec(), shapes: d.stream_shapes() })
        .collect();
    layout_of(names_of_datasets, &streams, map)
}

/// A dataset's stream names and shapes, in its order.
struct DatasetStreams {
    names: Vec<String>,
    shapes: Vec<StreamShape>,
}

impl DatasetStreams {
    /// What a dataset of `config` will have, from the configuration alone.
    fn configured(config: &DatasetConfig) -> Self {
        let specs = Dataset::configured_streams(config);
        Self {
            names: specs.iter().map(|s| s.name.clone()).collect(),
            shapes: StreamShape::of(&specs, config.precision == minibatchd_engine::options::Precision::Float64),
        }
    }
}

/// [`stream_layout`] over the datasets' streams.
fn layout_of(
    names_of_datasets: &[String],
    datasets: &[DatasetStreams],
    map: &BTreeMap<String, Vec<String>>,
) -> Result<StreamLayout, String> {
    let names: Vec<String> = if map.is_empty() { datasets[0].names.clone() } else { map.keys().cloned().collect() };
    let mut order = Vec::with_capacity(datasets.len());
    for (s, d) in datasets.iter().enumerate() {
        let mut mine = Vec::with_capacity(names.len());
        for name in &names {
            let wanted = map.get(name).and_then(|v| v.get(s)).unwrap_or(name);
            let Some(i) = d.names.iter().position(|n| n == wanted) else {
                return Err(format!(
                    "dataset '{}' has no stream '{wanted}' (its streams: {}){}",
                    names_of_datasets[s],
                    d.names.join(", "),
                    if map.is_empty() { "; map the datasets' streams with [mixtures.NAME.streams]" } else { "" }
                ));
            };
            mine.push(i);
        }
        order.push(mine);
    }
    let shapes: Vec<_> = order[0].iter().map(|&i| datasets[0].shapes[i]).collect();
    for (s, d) in datasets.iter().enumerate().skip(1) {
        for (k, &i) in order[s].iter().enumerate() {
            if d.shapes[i] != shapes[k] {
                return Err(format!(
                    "stream '{}' of the mixture: dataset '{}' gives {}, dataset '{}' gives {} (the streams mixed into one must have the same kind, dimension and precision)",
                    names[k], names_of_datasets[0], shapes[k], names_of_datasets[s], d.shapes[i]
                ));
            }
        }
    }
    Ok(StreamLayout { names, shapes, order })
}

/// The configuration check of a mixture's streams ([`stream_layout`] on what its datasets'
/// configurations say), so that `validate` and a reload refuse what every `open` would.
pub(crate) fn check_streams(
    names_of_datasets: &[String],
    datasets: &BTreeMap<String, DatasetConfig>,
    map: &BTreeMap<String, Vec<String>>,
) -> Result<(), String> {
    let streams: Option<Vec<DatasetStreams>> =
        names_of_datasets.iter().map(|n| datasets.get(n).map(DatasetStreams::configured)).collect();
    match streams {
        Some(streams) if !streams.is_empty() => layout_of(names_of_datasets, &streams, map).map(|_| ()),
        _ => Ok(()),
    }
}
