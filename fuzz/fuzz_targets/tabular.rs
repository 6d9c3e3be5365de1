#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    minibatchd_fuzz::tabular(data, minibatchd_fuzz::scratch_dir());
});
