//! The datasets the daemon serves, opened (indexed) once at start and shared by every stage:
//! the reader and parsers look chunks up here, sessions their timeline and stream schema.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, Precision};
use crate::dataset::Dataset;
use crate::protocol::StreamInfo;

/// An opened dataset and what sessions need to know about it.
#[derive(Debug)]
pub struct DatasetRuntime {
    /// Index in the hub (the first half of a chunk key).
    pub index: u32,
    /// Configured name.
    pub name: String,
    /// The dataset.
    pub dataset: Dataset,
    /// Stream names, in tensor order.
    pub names: Vec<String>,
    /// Stream dimensions.
    pub dims: Vec<usize>,
    /// Schema sent in `opened`.
    pub streams: Vec<StreamInfo>,
    /// [`Dataset::identity`], computed once.
    pub identity: u64,
    /// Longest sequence, in nominal samples (bounds a dense minibatch).
    pub max_seq_len: u64,
    /// Bytes per value.
    pub value_bytes: u64,
}

impl DatasetRuntime {
    fn new(index: u32, dataset: Dataset) -> Self {
        let (dtype, value_bytes) = match dataset.config().precision {
            Precision::Float32 => ("float32", 4),
            Precision::Float64 => ("float64", 8),
        };
        // The dataset's own stream list covers every format (CTF streams, deepx tensors).
        let streams = dataset
            .streams()
            .iter()
            .map(|s| StreamInfo { name: s.name.clone(), kind: s.kind.as_str().into(), dim: s.dim as u64, dtype: dtype.into() })
            .collect();
        Self {
            index,
            name: dataset.config().name.clone(),
            names: dataset.streams().iter().map(|s| s.name.clone()).collect(),
            dims: dataset.streams().iter().map(|s| s.dim).collect(),
            streams,
            identity: dataset.identity(),
            max_seq_len: dataset.timeline().seq_len.iter().copied().max().map_or(1, u64::from),
            value_bytes,
            dataset,
        }
    }

    /// A slot size that holds any minibatch of `local_samples` samples as far as dense streams
    /// go (sparse and string streams have no bound: a larger one fails with
    /// `minibatch_too_large`).
    #[must_use]
    pub fn dense_slot_bound(&self, local_samples: u64) -> u64 {
        let samples = local_samples.max(self.max_seq_len);
        let mut bytes = 4096u64; // headers, table and names
        for (s, &dim) in self.streams.iter().zip(&self.dims) {
            bytes = bytes.saturating_add((samples + 1).saturating_mul(8) + 64);
            if s.kind == "dense" {
                bytes = bytes.saturating_add(samples.saturating_mul(dim as u64).saturating_mul(self.value_bytes) + 64);
            }
        }
        bytes
    }
}

/// All configured datasets by name; the ones that failed to open keep their error.
#[derive(Debug, Default)]
pub struct Hub {
    by_name: BTreeMap<String, Result<Arc<DatasetRuntime>, String>>,
    by_index: Vec<Arc<DatasetRuntime>>,
}

impl Hub {
    /// Opens every dataset of `config` (indexing through the cache in `state_dir`). A dataset
    /// that fails is logged and refused to clients; the others are served.
    #[must_use]
    pub fn open(config: &Config) -> Self {
        let mut hub = Self::default();
        for (name, d) in &config.datasets {
            let state_dir: &Path = &config.daemon.state_dir;
            match Dataset::open(d, state_dir, &mut |_| {}) {
                Ok(ds) => {
                    let index = u32::try_from(hub.by_index.len()).unwrap_or(u32::MAX);
                    let rt = Arc::new(DatasetRuntime::new(index, ds));
                    tracing::info!(dataset = %name, sequences = rt.dataset.timeline().num_sequences(), chunks = rt.dataset.timeline().num_chunks(), "dataset ready");
                    hub.by_index.push(rt.clone());
                    hub.by_name.insert(name.clone(), Ok(rt));
                }
                Err(e) => {
                    tracing::error!(dataset = %name, error = %e, "cannot open dataset; sessions on it will be refused");
                    hub.by_name.insert(name.clone(), Err(e.to_string()));
                }
            }
        }
        hub
    }

    /// The dataset `name`.
    ///
    /// # Errors
    /// A message for an unknown or failed dataset.
    pub fn get(&self, name: &str) -> Result<Arc<DatasetRuntime>, String> {
        match self.by_name.get(name) {
            Some(Ok(d)) => Ok(d.clone()),
            Some(Err(e)) => Err(format!("dataset '{name}' failed to open: {e}")),
            None => Err(format!("no dataset '{name}' is configured (configured: {})", self.by_name.keys().cloned().collect::<Vec<_>>().join(", "))),
        }
    }

    /// The dataset with hub index `index`.
    #[must_use]
    pub fn by_index(&self, index: u32) -> Option<&Arc<DatasetRuntime>> {
        self.by_index.get(index as usize)
    }
}
