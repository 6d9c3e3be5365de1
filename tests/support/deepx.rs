//! The deepx instances of a minibatch, read back from its streams (named as deepx's tensors).

use minibatchd_engine::minibatch::MbValues as Values;
use minibatchd_engine::minibatch::{MbData, MbIndices as Indices, Minibatch};

/// One instance: CSR rows per X tensor, label, weight, uuid, history size.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub x: Vec<Vec<(u64, f32)>>,
    pub y: f32,
    pub w: f32,
    pub uuid: String,
    pub hist: Option<f32>,
}

/// The values of a float32 stream.
pub fn f32s(v: &Values) -> &[f32] {
    match v {
        Values::F32(v) => v,
        Values::F64(_) => panic!("float32 expected"),
    }
}

/// The instances of a minibatch, in order, from its streams named `names` (`__instX…`,
/// `__instXhist_size`, `__instY`, `__instW`, `__instUUID`). Streams absent from the dataset
/// keep their defaults: weight 1, empty uuid, no history size.
pub fn instances(mb: &Minibatch, names: &[String]) -> Vec<Instance> {
    let n = mb.streams[0].num_samples();
    let mut out = vec![Instance { x: Vec::new(), y: 0.0, w: 1.0, uuid: String::new(), hist: None }; n];
    for (name, s) in names.iter().zip(&mb.streams) {
        match &s.data {
            MbData::Sparse { sample_offsets, indices: Indices::U64(ids), values, .. } => {
                let values = f32s(values);
                for (j, inst) in out.iter_mut().enumerate() {
                    let (a, b) = (
                        usize::try_from(sample_offsets[j]).expect("offset"),
                        usize::try_from(sample_offsets[j + 1]).expect("offset"),
                    );
                    inst.x.push((a..b).map(|e| (ids[e], values[e])).collect());
                }
            }
            MbData::Dense { values, .. } => {
                let values = f32s(values);
                for (j, inst) in out.iter_mut().enumerate() {
                    match name.as_str() {
                        "__instY" => inst.y = values[j],
                        "__instW" => inst.w = values[j],
                        "__instXhist_size" => inst.hist = Some(values[j]),
                        other => panic!("unexpected dense stream {other}"),
                    }
                }
            }
            MbData::Strings { offsets, bytes } => {
                for (j, inst) in out.iter_mut().enumerate() {
                    let (a, b) = (
                        usize::try_from(offsets[j]).expect("offset"),
                        usize::try_from(offsets[j + 1]).expect("offset"),
                    );
                    inst.uuid = String::from_utf8(bytes[a..b].to_vec()).expect("utf-8");
                }
            }
            MbData::Sparse { .. } => panic!("u64 ids expected"),
        }
    }
    out
}
