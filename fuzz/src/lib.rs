//! The bodies of the fuzz targets (`fuzz/fuzz_targets/*.rs`), one function per target.
//!
//! The property of every target: no panic and no unbounded allocation (libFuzzer's
//! `-rss_limit_mb`), whatever the bytes. The same functions replay the committed corpus on
//! stable (`tests/fuzz_corpus.rs` includes this file as a module), so this file uses only what
//! the root package's tests may use: the workspace crates and `tempfile`.
//!
//! The first input byte picks the configuration (streams, format options, element type): one
//! target covers several small fixed configurations, and the fuzzer learns which byte does what.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use minibatchd_client::protocol::{decode_client, decode_server, FrameBuffer};
use minibatchd_engine::format::ctf::{index_file, CtfDecoder, CtfIndexOptions, Element, SeqContext, StreamBuf};
use minibatchd_engine::format::deepx::{
    index_reader, DeepxDecoder, DeepxElement, LineContext, LineIndexOptions, Schema,
};
use minibatchd_engine::options::{DeepxOptions, FormatKind, StreamConfig, StreamFormat};

/// A directory for the CTF targets' data file (the CTF index pass reads a path), made once per
/// process and left in the system temp dir by the fuzzer (the replay test passes its own).
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::Builder::new().prefix("minibatchd-fuzz").tempdir().expect("a temp dir")).path()
}

fn stream(name: &str, dim: usize, sparse: bool, main: bool) -> StreamConfig {
    StreamConfig {
        name: name.into(),
        alias: name.into(),
        dim,
        format: if sparse { StreamFormat::Sparse } else { StreamFormat::Dense },
        defines_mb_size: main,
    }
}

/// The CTF configuration that `sel` picks: streams, and the index options that go with them.
fn ctf_config(sel: u8) -> (Vec<StreamConfig>, CtfIndexOptions) {
    let streams = match sel & 3 {
        0 => vec![stream("a", 3, false, false), stream("b", 5, true, false)],
        1 => vec![stream("features", 2, false, true), stream("labels", 4, true, false)],
        // Bit 4 clear: wide enough for every value of a 64-byte window (the dense kernel reads
        // whole windows); set: one value, so that longer samples are rejected.
        2 => vec![stream("x", if sel & 16 == 0 { 40 } else { 1 }, false, false)],
        _ => vec![stream("s", 1000, true, false), stream("d", 0, false, false), stream("e", 2, false, false)],
    };
    let main_alias = streams.iter().find(|s| s.defines_mb_size).map(|s| s.alias.clone());
    (streams, CtfIndexOptions { skip_sequence_ids: sel & 4 != 0, main_alias })
}

/// Writes `body` to the scratch file and indexes it.
fn ctf_index_bytes(
    body: &[u8],
    scratch: &Path,
    options: &CtfIndexOptions,
) -> Option<minibatchd_engine::format::FileIndex> {
    let path = scratch.join("input.ctf");
    std::fs::write(&path, body).expect("writing the scratch file");
    index_file(&path, options, minibatchd_engine::options::IndexLimits::UNBOUNDED, 1, &mut |_| {}).ok()
}

/// `ctf_index`: the CTF index pass on arbitrary bytes; every sequence it reports lies inside the
/// file.
pub fn ctf_index(data: &[u8], scratch: &Path) {
    let Some((&sel, body)) = data.split_first() else { return };
    let (_, options) = ctf_config(sel);
    if let Some(idx) = ctf_index_bytes(body, scratch, &options) {
        for seq in &idx.sequences {
            assert!(seq.offset + u64::from(seq.size) <= body.len() as u64, "a sequence past the end of the file");
        }
    }
}

/// `ctf_decode`: index, then decode every sequence as a chunk load does (f32 or f64).
pub fn ctf_decode(data: &[u8], scratch: &Path) {
    let Some((&sel, body)) = data.split_first() else { return };
    if sel & 8 == 0 {
        ctf_decode_as::<f32>(sel, body, scratch);
    } else {
        ctf_decode_as::<f64>(sel, body, scratch);
    }
}

fn ctf_decode_as<T: Element + Into<f64>>(sel: u8, body: &[u8], scratch: &Path) {
    let (streams, options) = ctf_config(sel);
    let Some(idx) = ctf_index_bytes(body, scratch, &options) else { return };
    // The dense fast path (the vector kernel where the CPU has AVX2) against the byte loop alone:
    // the same values to the bit, the same errors, the same fatal sequence.
    let (bufs, errors, fatal) = ctf_decode_buffers::<T>(&CtfDecoder::new(&streams), &idx, body);
    let slow = ctf_decode_buffers::<T>(&CtfDecoder::new(&streams).without_fast_path(), &idx, body);
    assert!(bits(&bufs) == bits(&slow.0), "the fast path read other values");
    assert_eq!(errors, slow.1, "the fast path reported other errors");
    assert_eq!(fatal, slow.2, "the fast path failed another sequence");
    // And the fast path without its vector kernel, as on a CPU without AVX2.
    let windows = ctf_decode_buffers::<T>(&CtfDecoder::new(&streams).without_kernel(), &idx, body);
    assert!(bits(&windows.0) == bits(&slow.0), "the fast path without the kernel read other values");
    assert_eq!((windows.1, windows.2), (slow.1, slow.2), "the fast path without the kernel decided otherwise");
    if fatal.is_some() {
        return; // fatal: the chunk load stops there
    }
    for (b, s) in bufs.iter().zip(&streams) {
        assert_eq!(b.seq_offsets.len(), idx.sequences.len() + 1);
        assert_eq!(b.seq_offsets.last().copied(), Some(b.samples));
        if s.format == StreamFormat::Dense {
            assert_eq!(b.values.len(), b.samples * s.dim);
        } else {
            assert_eq!(b.sample_offsets.len(), b.samples + 1);
            assert_eq!(b.indices.len(), b.values.len());
        }
    }
}

/// A decode's buffers, its errors' texts, and the fatal sequence's number and message if any.
type Decoded<T> = (Vec<StreamBuf<T>>, Vec<String>, Option<(usize, String)>);

/// Decodes every sequence of `idx` until a fatal one.
fn ctf_decode_buffers<T: Element>(
    dec: &CtfDecoder,
    idx: &minibatchd_engine::format::FileIndex,
    body: &[u8],
) -> Decoded<T> {
    let mut bufs: Vec<StreamBuf<T>> = (0..dec.num_streams()).map(|_| StreamBuf::new()).collect();
    let mut errors = Vec::new();
    for (q, seq) in idx.sequences.iter().enumerate() {
        let start = usize::try_from(seq.offset).expect("an offset inside the input");
        let bytes = &body[start..start + seq.size as usize];
        if let Err(e) = dec.decode_sequence(bytes, &SeqContext { file: &idx.path, seq: &seq }, &mut bufs, &mut errors) {
            return (bufs, errors.iter().map(ToString::to_string).collect(), Some((q, e.to_string())));
        }
    }
    (bufs, errors.iter().map(ToString::to_string).collect(), None)
}

/// Every value of the buffers as the bits of its `f64`.
fn bits<T: Element + Into<f64>>(bufs: &[StreamBuf<T>]) -> Vec<Vec<u64>> {
    bufs.iter().map(|b| b.values.iter().map(|&v| Into::<f64>::into(v).to_bits()).collect()).collect()
}

/// The deepx configuration that `sel` picks.
fn deepx_config(sel: u8) -> (FormatKind, DeepxOptions) {
    let groups = usize::from(sel >> 6) + 1;
    let mut o = DeepxOptions {
        label_size: if sel & 0x10 != 0 { 2 } else { 1 },
        w: sel & 4 != 0,
        uuid: sel & 8 != 0,
        ..DeepxOptions::default()
    };
    let format = match sel & 3 {
        0 => FormatKind::Libsvm,
        1 => {
            o.x_size = Some(groups);
            FormatKind::LibsvmEx
        }
        2 => {
            o.x_hist_item_size = Some(groups);
            FormatKind::Uch
        }
        _ => {
            // svmlight: comments, qid and 1-based ids
            o.comments = true;
            o.qid = true;
            o.feature_index_base = 1;
            FormatKind::Libsvm
        }
    };
    (format, o)
}

/// `deepx_decode`: index the bytes as lines, decode each as a chunk load does, and build the
/// chunk's streams (libsvm, svmlight, `libsvm_ex`, uch; f32 or f64).
pub fn deepx_decode(data: &[u8], _scratch: &Path) {
    let Some((&sel, body)) = data.split_first() else { return };
    let (format, options) = deepx_config(sel);
    let f64_values = body.first().is_some_and(|b| b & 1 != 0);
    if f64_values {
        deepx_decode_as::<f64>(format, &options, body);
    } else {
        deepx_decode_as::<f32>(format, &options, body);
    }
}

fn deepx_decode_as<T: DeepxElement>(format: FormatKind, options: &DeepxOptions, body: &[u8]) {
    let schema = Schema::new(format, options);
    let path: Arc<Path> = Arc::from(Path::new("fuzz.txt"));
    let index_options = LineIndexOptions { comments: schema.comments };
    let Ok(idx) = index_reader(
        body,
        path.clone(),
        body.len() as u64,
        index_options,
        minibatchd_engine::options::IndexLimits::UNBOUNDED,
        &mut |_| {},
    ) else {
        return;
    };
    let dec = DeepxDecoder::new(schema);
    let mut bufs = dec.buffers_for::<T>(body.len(), idx.sequences.len(), true);
    let mut errors = Vec::new();
    // The reference for the plain-feature fast path: the general readers alone.
    let general = dec.clone().general_only();
    let (mut general_bufs, mut general_errors) = (general.buffers::<T>(), Vec::new());
    // Each line alone as well: the chunk's features are the lines' in order, however the chunk
    // stores its ids (32 bits until one needs more, then widened mid-chunk).
    let mut alone: Vec<Vec<u64>> = vec![Vec::new(); bufs.x.len()];
    for seq in &idx.sequences {
        let start = usize::try_from(seq.offset).expect("an offset inside the input");
        let bytes = &body[start..start + seq.size as usize];
        let ctx = LineContext { file: &path, line: seq.line, offset: seq.offset };
        dec.decode_line(bytes, &ctx, &mut bufs, &mut errors);
        general.decode_line(bytes, &ctx, &mut general_bufs, &mut general_errors);
        let mut one = dec.buffers::<T>();
        dec.decode_line(bytes, &ctx, &mut one, &mut Vec::new());
        for (all, x) in alone.iter_mut().zip(&one.x) {
            all.extend(x.ids());
        }
    }
    for (x, all) in bufs.x.iter().zip(&alone) {
        assert_eq!(&x.ids(), all, "a chunk's ids differ from its lines'");
        // Kept narrow exactly while every id fits (a second rolled-back line may have widened
        // them for good).
        if errors.len() < 2 {
            assert_eq!(x.narrow(), all.iter().all(|&id| u32::try_from(id).is_ok()), "ids widened without need");
        }
    }
    assert_eq!(format!("{errors:?}"), format!("{general_errors:?}"), "the fast path's errors differ");
    for (x, g) in bufs.x.iter().zip(&general_bufs.x) {
        let bits = |v: &[T]| v.iter().map(|&e| Into::<f64>::into(e).to_bits()).collect::<Vec<u64>>();
        assert_eq!(x.ids(), g.ids(), "the fast path's ids differ");
        assert_eq!(bits(&x.values), bits(&g.values), "the fast path's values differ");
        assert_eq!(x.sample_offsets, g.sample_offsets, "the fast path's samples differ");
    }
    let samples = bufs.samples;
    assert_eq!(bufs.seq_offsets.len(), idx.sequences.len() + 1);
    assert_eq!(samples + errors.len(), idx.sequences.len());
    let specs = dec.schema().specs();
    let streams = dec.into_streams(bufs);
    assert_eq!(streams.len(), specs.len());
}

/// `config_load`: a configuration file's text, parsed and validated (no file is read).
pub fn config_load(data: &[u8], scratch: &Path) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = minibatchd::Config::from_toml_str(text, scratch);
    }
}

/// `protocol`: the bytes as one frame body from either side, then as a byte stream cut into
/// pieces (sizes from the first byte) through a [`FrameBuffer`], every frame decoded both ways.
pub fn protocol(data: &[u8], _scratch: &Path) {
    let _ = decode_client(data);
    let _ = decode_server(data);
    let Some((&sel, stream)) = data.split_first() else { return };
    let piece = usize::from(sel % 16) + 1;
    let mut frames = FrameBuffer::default();
    for part in stream.chunks(piece) {
        frames.push(part);
        loop {
            match frames.next_frame() {
                Ok(Some(body)) => {
                    let _ = decode_client(&body);
                    let _ = decode_server(&body);
                }
                Ok(None) => break,
                Err(_) => return, // the connection is closed on a bad prefix
            }
        }
    }
}

/// `index_cache`: `format::index_cache::load` on a cache file made from the bytes. The first byte
/// picks how: bit 0 clear — the bytes after it are the whole file; set — a header that matches
/// the data file (path, version, options) is written first, then the bytes as the record
/// count, the columns byte, the first offset and the records, then (bit 1 clear) a valid
/// checksum. Bit 2 caps the sequences at 3. A
/// loaded index must describe only sequences inside the data file.
pub fn index_cache(data: &[u8], scratch: &Path) {
    use minibatchd_engine::format::index_cache::{self, cache_path, load, FileStamp, INDEX_DIR};
    use minibatchd_engine::state_file;
    let Some((&sel, body)) = data.split_first() else { return };
    let file = scratch.join("indexed.ctf");
    if !file.exists() {
        std::fs::write(&file, "|a 1\n|a 2\n|a 3\n|a 4\n").expect("writing the data file");
    }
    let Ok(stamp) = FileStamp::of(&file) else { return };
    let state = scratch.join("state");
    if state_file::private_subdir(&state, INDEX_DIR).is_err() {
        return;
    }
    let fingerprint = "fuzz;v1";
    let bytes = if sel & 1 == 0 {
        body.to_vec()
    } else {
        let mut out = Vec::new();
        out.extend_from_slice(b"MBDINDEX");
        out.extend_from_slice(&index_cache::VERSION.to_le_bytes());
        let path = stamp.path.as_os_str().as_encoded_bytes();
        for field in [path, fingerprint.as_bytes()] {
            out.extend_from_slice(&u32::try_from(field.len()).unwrap_or(u32::MAX).to_le_bytes());
            out.extend_from_slice(field);
        }
        out.extend_from_slice(&stamp.version_bytes());
        out.extend_from_slice(&0u32.to_le_bytes()); // the content's digest
        out.extend_from_slice(body);
        if sel & 2 == 0 {
            let sum = index_cache::checksum(&out);
            out.extend_from_slice(&sum.to_le_bytes());
        }
        out
    };
    if state_file::write_atomic(&cache_path(&state, &stamp, fingerprint), &bytes).is_err() {
        return;
    }
    let max = if sel & 4 == 0 { u64::MAX } else { 3 };
    let name: Arc<Path> = Arc::from(file.as_path());
    if let Ok(index) = load(&state, &stamp, fingerprint, &name, max) {
        assert!(index.sequences.len() as u64 <= max, "more sequences than allowed");
        // In file order without overlap: the chunks, reads and remote ranges are built from them.
        let mut end = 0;
        for s in &index.sequences {
            assert!(s.offset + u64::from(s.size) <= stamp.size && s.samples > 0, "a sequence outside the file: {s:?}");
            assert!(s.offset >= end, "a sequence before the end of the previous one: {s:?}");
            end = s.offset + u64::from(s.size);
        }
    }
}

/// `parsed_cache`: `ParsedCache::get` on an entry made from the bytes, asked for chunk 0 of one
/// identity with 2 sequences and four streams (dense of dim 3, CTF sparse of dim 10, deepx ids,
/// strings). The first byte picks how: bit 0 — float64 instead of float32; bit 1 clear — the bytes
/// after it are the whole entry; set — a header that matches what is asked for is written first
/// and the bytes are the payload, then (bit 2 clear) the right checksum and end mark, so the
/// fuzzer reaches the structural checks. A chunk served must hold what the gather assumes:
/// offsets from 0, never decreasing, ending at the lengths they index; dense values of
/// samples × dim; CTF indices below the dimension.
pub fn parsed_cache(data: &[u8], scratch: &Path) {
    use minibatchd_engine::format::chunk::{Indices, StreamKind, StreamSpec, StreamValues};
    use minibatchd_engine::format::parsed_cache::{checksum, entry_name, ParsedCache};
    use minibatchd_engine::options::Precision;
    const ID: u64 = 0x6d62_645f_6675_7a7a;
    let Some((&sel, body)) = data.split_first() else { return };
    let Ok(cache) = ParsedCache::open(&scratch.join("parsed"), 1 << 26) else { return };
    let precision = if sel & 1 == 0 { Precision::Float32 } else { Precision::Float64 };
    let specs = [
        StreamSpec { name: "x".into(), kind: StreamKind::Dense, dim: 3 },
        StreamSpec { name: "s".into(), kind: StreamKind::SparseI32, dim: 10 },
        StreamSpec { name: "id".into(), kind: StreamKind::SparseU64, dim: 0 },
        StreamSpec { name: "u".into(), kind: StreamKind::Strings, dim: 0 },
    ];
    let bytes = if sel & 2 == 0 {
        body.to_vec()
    } else {
        let mut out = Vec::new();
        out.extend_from_slice(b"MBDPARSD");
        out.extend_from_slice(&1u32.to_ne_bytes());
        out.extend_from_slice(&1u32.to_ne_bytes());
        for v in [ID, 0, 2, specs.len() as u64, body.len() as u64] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
        out.extend_from_slice(body);
        if sel & 4 == 0 {
            let crc = checksum(&out);
            out.extend_from_slice(&crc.to_ne_bytes());
            out.extend_from_slice(b"END1");
        }
        out
    };
    if std::fs::write(cache.dir().join(entry_name(ID, 0)), &bytes).is_err() {
        return;
    }
    let Some(chunk) = cache.get(ID, 0, 2, &specs, precision) else { return };
    let monotone =
        |o: &[usize], end: usize| o.first() == Some(&0) && o.last() == Some(&end) && o.windows(2).all(|w| w[0] <= w[1]);
    assert_eq!(chunk.num_sequences, 2);
    for (s, spec) in chunk.streams.iter().zip(&specs) {
        assert_eq!(s.seq_offsets.len(), 3);
        let samples = s.seq_offsets[2];
        assert!(monotone(&s.seq_offsets, samples));
        match &s.data {
            StreamValues::Dense { dim, values } => assert_eq!(values.len(), samples * dim),
            StreamValues::Sparse { sample_offsets, indices, values } => {
                assert_eq!(sample_offsets.len(), samples + 1);
                assert!(monotone(sample_offsets, values.len()));
                match indices {
                    Indices::I32(ix) => {
                        assert!(
                            spec.kind == StreamKind::SparseI32
                                && ix.len() == values.len()
                                && ix.iter().all(|&i| usize::try_from(i).is_ok_and(|i| i < spec.dim))
                        );
                    }
                    Indices::U32(ix) => assert!(spec.kind == StreamKind::SparseU64 && ix.len() == values.len()),
                    Indices::U64(ix) => assert!(spec.kind == StreamKind::SparseU64 && ix.len() == values.len()),
                }
            }
            StreamValues::Strings { offsets, bytes } => {
                assert_eq!(offsets.len(), samples + 1);
                assert!(monotone(offsets, bytes.len()));
            }
        }
    }
}

/// `tfrecord`: the bytes as a TFRecord file — the index pass, then every record it finds decoded
/// as a `tf.train.Example` (first byte: the streams' dtypes, lengths and defaults, and the
/// precision); every record is a sample of each stream or an error, never a panic.
pub fn tfrecord(data: &[u8], _scratch: &Path) {
    use minibatchd_engine::format::tfrecord::{self, example::ExampleDecoder};
    use minibatchd_engine::options::{ExampleFeature, FeatureDefault, FeatureLength, FeatureType};
    let Some((&sel, body)) = data.split_first() else { return };
    let dtype = |bit: u8| if sel & bit != 0 { FeatureType::Int64 } else { FeatureType::Float };
    let features = vec![
        ExampleFeature {
            stream: "a".into(),
            key: "a".into(),
            dtype: dtype(1),
            length: FeatureLength::Fixed { default: (sel & 2 != 0).then(|| FeatureDefault::Numbers(vec![1.0, 2.0])) },
            dim: 2,
        },
        ExampleFeature { stream: "b".into(), key: "b".into(), dtype: dtype(4), length: FeatureLength::Var, dim: 3 },
        // Bytes: a sequence of byte strings, or exactly one with a default.
        ExampleFeature {
            stream: "c".into(),
            key: "c".into(),
            dtype: FeatureType::Bytes,
            length: if sel & 16 != 0 {
                FeatureLength::Sequence
            } else {
                FeatureLength::Fixed { default: Some(FeatureDefault::Bytes(vec![b"none".to_vec()])) }
            },
            dim: 1,
        },
        ExampleFeature {
            stream: "d".into(),
            key: "d".into(),
            dtype: dtype(32),
            length: FeatureLength::Sequence,
            dim: 2,
        },
    ];
    let path: Arc<Path> = Arc::from(Path::new("fuzz.tfrecord"));
    let limits = minibatchd_engine::options::IndexLimits::UNBOUNDED;
    let Ok(idx) = tfrecord::index_reader(body, path.clone(), body.len() as u64, limits, &mut |_| {}) else { return };
    let dec = ExampleDecoder::new(&features);
    if sel & 8 != 0 {
        tfrecord_decode_as::<f64>(&dec, &idx, body, &path);
    } else {
        tfrecord_decode_as::<f32>(&dec, &idx, body, &path);
    }
}

fn tfrecord_decode_as<T: DeepxElement>(
    dec: &minibatchd_engine::format::tfrecord::example::ExampleDecoder,
    idx: &minibatchd_engine::format::FileIndex,
    body: &[u8],
    path: &Arc<Path>,
) {
    let mut bufs: Vec<StreamBuf<T>> = (0..4).map(|_| StreamBuf::new()).collect();
    let mut errors = Vec::new();
    for seq in &idx.sequences {
        let start = usize::try_from(seq.offset).expect("an offset inside the input");
        let frame = &body[start..start + seq.size as usize];
        let at = minibatchd_engine::format::tfrecord::example::record_location(path, seq.line, seq.offset);
        dec.decode_record(frame, &at, &mut bufs, &mut errors);
    }
    for b in &bufs {
        assert_eq!(b.seq_offsets.len(), idx.sequences.len() + 1, "a record is one sequence");
        assert!(b.seq_offsets.windows(2).all(|w| w[0] <= w[1]), "sequences in order");
        assert_eq!(b.seq_offsets.last().copied(), Some(b.samples), "every sample in a sequence");
    }
    for b in &bufs[..2] {
        assert_eq!(b.samples + errors.len(), idx.sequences.len(), "a record is a sample or an error");
    }
    assert_eq!(bufs[0].values.len(), bufs[0].samples * 2, "a fixed-length stream holds dim values a sample");
    let c = &bufs[2];
    assert_eq!(c.sample_offsets.len(), c.samples + 1, "a byte string a sample");
    assert_eq!(c.sample_offsets.last().copied(), Some(c.bytes.len()), "every byte in a sample");
    assert_eq!(bufs[3].values.len(), bufs[3].samples * 2, "a sequence stream holds dim values a sample");
}

/// CSV and fixed-length records: the input's first byte picks the options (delimiter, quoting,
/// header lines, record layout, types, byte order, precision), the rest is a file; it is indexed
/// and every record decoded. Every record is one sequence of one sample or one error, whatever
/// the bytes; nothing panics.
pub fn tabular(data: &[u8], _scratch: &Path) {
    use minibatchd_engine::format::csv::{self, CsvDecoder, CsvLayout, CsvOptions, CsvStream, CsvType, CsvValue};
    use minibatchd_engine::format::fixed::{self, FixedLengthOptions, RawDecoder, RawStream, RawType};
    use minibatchd_engine::format::record::StreamBufDecoder as _;
    let Some((&sel, body)) = data.split_first() else { return };
    let path: Arc<Path> = Arc::from(Path::new("fuzz.bin"));
    let limits = minibatchd_engine::options::IndexLimits::UNBOUNDED;
    let size = body.len() as u64;
    let (idx, records): (minibatchd_engine::format::FileIndex, Vec<&[u8]>) = if sel & 1 == 0 {
        let layout = CsvLayout { skip_header_lines: u64::from(sel >> 6) };
        let Ok(idx) = csv::index_reader(body, path.clone(), size, layout, limits, &mut |_| {}) else { return };
        let records = slices(&idx, body);
        (idx, records)
    } else {
        let layout = FixedLengthOptions {
            record_bytes: u32::from(sel >> 4) + 1,
            header_bytes: u64::from((sel >> 1) & 1),
            footer_bytes: u64::from((sel >> 2) & 1),
        };
        let Ok(idx) = fixed::index_reader(body, path.clone(), size, layout, limits, &mut |_| {}) else { return };
        let records = slices(&idx, body);
        (idx, records)
    };
    let csv_decoder = CsvDecoder::new(
        CsvOptions {
            columns: 3,
            field_delim: if sel & 2 != 0 { b';' } else { b',' },
            use_quote_delim: sel & 4 == 0,
            na_value: b"NA".to_vec(),
        },
        vec![
            CsvStream {
                name: "a".into(),
                dtype: CsvType::F32,
                columns: vec![0, 2],
                default: Some(CsvValue::Float(0.5)),
            },
            CsvStream {
                name: "b".into(),
                dtype: if sel & 8 != 0 { CsvType::I64 } else { CsvType::I32 },
                columns: vec![1],
                default: None,
            },
            CsvStream {
                name: "c".into(),
                dtype: CsvType::String,
                columns: vec![2],
                default: (sel & 16 != 0).then(|| CsvValue::Text(b"-".to_vec())),
            },
        ],
    );
    let raw_decoder = RawDecoder::new(vec![
        RawStream { name: "x".into(), dtype: RawType::F16, offset: 0, dim: 1, little_endian: sel & 8 != 0 },
        RawStream { name: "y".into(), dtype: RawType::I64, offset: 1, dim: 1, little_endian: sel & 32 != 0 },
    ]);
    let decode = |record: &[u8],
                  i: usize,
                  out: &mut Vec<StreamBuf<f32>>,
                  errors: &mut Vec<minibatchd_engine::format::Malformed>| {
        let at = minibatchd_engine::format::deepx::LineContext { file: &path, line: i as u64, offset: 0 };
        if sel & 1 == 0 {
            csv_decoder.decode_record(record, &at, out, errors);
        } else {
            raw_decoder.decode_record(record, &at, out, errors);
        }
    };
    let streams = if sel & 1 == 0 { 3 } else { 2 };
    let mut out: Vec<StreamBuf<f32>> = (0..streams).map(|_| StreamBuf::new()).collect();
    let mut errors = Vec::new();
    for (i, r) in records.iter().enumerate() {
        decode(r, i, &mut out, &mut errors);
    }
    for b in &out {
        assert_eq!(b.seq_offsets.len(), idx.sequences.len() + 1, "a record is one sequence");
        assert_eq!(b.samples + errors.len(), idx.sequences.len(), "a record is a sample or an error");
    }
    if let Some(c) = out.get(2) {
        assert_eq!(c.sample_offsets.len(), c.samples + 1, "a string a sample");
        assert_eq!(c.sample_offsets.last().copied(), Some(c.bytes.len()), "every byte in a sample");
    }
}

/// The bytes of each record an index names in `body`.
fn slices<'a>(idx: &minibatchd_engine::format::FileIndex, body: &'a [u8]) -> Vec<&'a [u8]> {
    idx.sequences
        .iter()
        .map(|s| {
            let start = usize::try_from(s.offset).expect("an offset inside the input");
            &body[start..start + s.size as usize]
        })
        .collect()
}
