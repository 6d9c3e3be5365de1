//! Property tests of the deepx formats: generated instances survive render → parse unchanged,
//! whatever the format, chunk size, blanks (several, tabs, trailing), line ends (LF, CRLF, none
//! at EOF), blank lines and gzip (one or several members); and no input makes the decoder panic.

mod support;

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use minibatchd::config::{DeepxOptions, FormatKind};
use minibatchd::dump::for_each_minibatch;
use minibatchd_engine::format::deepx::{DeepxDecoder, LineContext, Schema};
use minibatchd_engine::sampling::EpochLimit;
use proptest::prelude::*;
use support::deepx::{instances, Instance};
use support::{dump_options, in_file_order, write};

/// A generated instance: label, weight, uuid, feature groups (one for libsvm).
#[derive(Debug, Clone, PartialEq)]
struct Inst {
    label: f32,
    weight: f32,
    uuid: String,
    groups: Vec<Vec<(u64, f32)>>,
}

/// An instance read back; its history size is not compared (`uch_view` models the slots alone).
impl From<Instance> for Inst {
    fn from(i: Instance) -> Self {
        Inst { label: i.y, weight: i.w, uuid: i.uuid, groups: i.x }
    }
}

#[derive(Debug, Clone)]
struct Style {
    sep: &'static str,
    crlf: bool,
    trailing: &'static str,
    final_newline: bool,
    blank_every: usize,
    chunk_size: u64,
    gzip_members: usize,
}

/// Values that print exactly and are in deepx's ranges.
#[allow(clippy::cast_precision_loss)] // |q| <= 40_000: exact in an f32
fn value(max: i32) -> impl Strategy<Value = f32> {
    (-4 * max..=4 * max).prop_map(|q| q as f32 / 4.0)
}

/// Small ids, ids on both sides of 2^32 (a chunk keeps ids in 32 bits until one needs more) and
/// any `u64`.
fn id() -> impl Strategy<Value = u64> {
    const MAX32: u64 = u32::MAX as u64;
    prop_oneof![0u64..100, MAX32 - 2..MAX32 + 3, any::<u64>()]
}

fn group() -> impl Strategy<Value = Vec<(u64, f32)>> {
    prop::collection::vec((id(), value(100)), 1..5)
}

/// `groups`: the number of groups (libsvm: 1, and it may be empty; uch: 2 + history).
fn inst(format: FormatKind) -> impl Strategy<Value = Inst> {
    let groups = match format {
        FormatKind::Libsvm => prop::collection::vec((id(), value(100)), 0..5).prop_map(|g| vec![g]).boxed(),
        FormatKind::LibsvmEx => prop::collection::vec(group(), 3).boxed(),
        _ => prop::collection::vec(group(), 2..6).boxed(),
    };
    (value(10_000), 1u16..=400, prop::sample::select(vec!["", "u1", "a:b|c", "0"]), groups)
        .prop_map(|(label, w, uuid, groups)| Inst { label, weight: f32::from(w) / 4.0, uuid: uuid.to_owned(), groups })
}

fn style() -> impl Strategy<Value = Style> {
    (
        prop::sample::select(vec![" ", "\t", "  ", " \t "]),
        any::<bool>(),
        prop::sample::select(vec!["", " ", "\t ", "   "]),
        any::<bool>(),
        0usize..4,
        1u64..300,
        0usize..3,
    )
        .prop_map(|(sep, crlf, trailing, final_newline, blank_every, chunk_size, gzip_members)| Style {
            sep,
            crlf,
            trailing,
            final_newline,
            blank_every,
            chunk_size,
            gzip_members,
        })
}

#[allow(clippy::float_cmp)] // a feature of value exactly 1 is written as a bare id
fn render(insts: &[Inst], s: &Style) -> String {
    let nl = if s.crlf { "\r\n" } else { "\n" };
    let mut out = String::new();
    for (i, x) in insts.iter().enumerate() {
        write!(out, "{}:{}", x.label, x.weight).expect("writing to a String");
        if !x.uuid.is_empty() {
            write!(out, "{}uuid:{}", s.sep, x.uuid).expect("writing to a String");
        }
        for (g, entries) in x.groups.iter().enumerate() {
            out.push_str(s.sep);
            if g > 0 {
                out.push('|');
                out.push_str(if g % 2 == 0 { s.sep } else { "" });
            }
            let feats: Vec<String> = entries
                .iter()
                .map(|&(id, v)| if v == 1.0 && id % 2 == 0 { format!("{id}") } else { format!("{id}:{v}") })
                .collect();
            out.push_str(&feats.join(s.sep));
        }
        out.push_str(s.trailing);
        if i + 1 < insts.len() || s.final_newline {
            out.push_str(nl);
        }
        if s.blank_every > 0 && i % s.blank_every == 0 && i + 1 < insts.len() {
            out.push_str(s.trailing);
            out.push_str(nl);
        }
    }
    out
}

fn gzip(text: &[u8], members: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let step = text.len() / members + 1;
    for part in text.chunks(step) {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(part).expect("compress");
        out.extend(e.finish().expect("finish"));
    }
    out
}

fn read_back(format: FormatKind, slots: usize, insts: &[Inst], s: &Style) -> Vec<Inst> {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = render(insts, s);
    if s.gzip_members > 0 {
        write(dir.path(), "data", gzip(text.as_bytes(), s.gzip_members));
    } else {
        write(dir.path(), "data", &text);
    }
    let (name, extra) = match format {
        FormatKind::Libsvm => ("libsvm", String::new()),
        FormatKind::LibsvmEx => ("libsvm_ex", "x_size = 3".to_owned()),
        _ => ("uch", format!("x_hist_item_size = {slots}")),
    };
    let cfg = format!(
        "[datasets.d]\nformat = \"{name}\"\nfiles = [\"data\"]\nchunk_size_bytes = {}\nw = true\nuuid = true\n{extra}\n",
        s.chunk_size
    );
    let ds = support::open(&cfg, "d", dir.path(), dir.path());
    let opts = dump_options(in_file_order(EpochLimit::FullSweep), 3, true);
    let names = ds.stream_names().to_vec();
    let mut out = Vec::new();
    for_each_minibatch(&ds, &opts, &mut |mb| {
        out.extend(instances(mb, &names).into_iter().map(Inst::from));
        Ok(())
    })
    .expect("sweep");
    out
}

/// What `uch` keeps of an instance: user, candidate, `slots` history slots (empty when absent).
fn uch_view(x: &Inst, slots: usize) -> Inst {
    let mut groups = x.groups[..2].to_vec();
    for h in 0..slots {
        groups.push(x.groups.get(2 + h).cloned().unwrap_or_default());
    }
    Inst { groups, ..x.clone() }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn libsvm_instances_round_trip(insts in prop::collection::vec(inst(FormatKind::Libsvm), 1..12), s in style()) {
        prop_assert_eq!(read_back(FormatKind::Libsvm, 0, &insts, &s), insts);
    }

    #[test]
    fn libsvm_ex_instances_round_trip(insts in prop::collection::vec(inst(FormatKind::LibsvmEx), 1..12), s in style()) {
        prop_assert_eq!(read_back(FormatKind::LibsvmEx, 0, &insts, &s), insts);
    }

    #[test]
    fn uch_instances_round_trip(insts in prop::collection::vec(inst(FormatKind::Uch), 1..12), s in style(), slots in 1usize..4) {
        let expected: Vec<Inst> = insts.iter().map(|x| uch_view(x, slots)).collect();
        prop_assert_eq!(read_back(FormatKind::Uch, slots, &insts, &s), expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any bytes: the decoder never panics, and a line is either one sample or one error.
    #[test]
    fn hostile_lines_never_panic(
        line in prop::collection::vec(prop::sample::select(b"0123456789 \t:|.-+eE#uuid:qx\r\xff".to_vec()), 0..40),
        format in prop::sample::select(vec![FormatKind::Libsvm, FormatKind::LibsvmEx, FormatKind::Uch]),
        svmlight in any::<bool>(),
    ) {
        let o = DeepxOptions {
            label_size: 2,
            w: true,
            uuid: true,
            x_size: Some(2),
            x_hist_item_size: Some(2),
            comments: svmlight,
            qid: svmlight,
            feature_index_base: u8::from(svmlight),
            ..DeepxOptions::default()
        };
        let d = DeepxDecoder::new(Schema::new(format, &o));
        let mut b = d.buffers::<f64>();
        let mut errors = Vec::new();
        let file: Arc<Path> = Arc::from(Path::new("h"));
        d.decode_line(&line, &LineContext { file: &file, line: 0, offset: 0 }, &mut b, &mut errors);
        prop_assert_eq!(b.samples + errors.len(), 1);
        prop_assert_eq!(b.y.len(), 2 * b.samples);
        prop_assert!(b.x.iter().all(|x| x.sample_offsets.len() == b.samples + 1 && x.ids().len() == x.values.len()));
    }
}
