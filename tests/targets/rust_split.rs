// A 3:1 split in Rust built with `rustc -O` and no force-frame-pointers, by
// tests/system/test_cfi_targets.py: heavy() sorts each round's input three times with
// `sort_unstable_by` and a slow comparator, light() once (same input, same comparisons:
// exactly 3:1). The comparator is called from core's sort code and `slow_cmp` is a leaf
// without a frame. Rounds have random sizes, since a fixed-length round aliases with
// cpu-clock's fixed sampling period (see split.c). Usage: rust_split SECONDS (of CPU time).
use std::hint::black_box;

#[inline(never)]
fn slow_cmp(a: &u64, b: &u64) -> std::cmp::Ordering {
    let mut x = *a;
    for i in 0..48u64 {
        x = black_box(x.wrapping_mul(2654435761).wrapping_add(i));
    }
    black_box(x);
    a.cmp(b)
}

#[inline(never)]
fn sort_copy(input: &[u64]) -> u64 {
    let mut v = input.to_vec();
    v.sort_unstable_by(slow_cmp);
    v[v.len() / 2]
}

#[inline(never)]
fn heavy(input: &[u64]) -> u64 {
    let mut acc = 0;
    for _ in 0..3 {
        acc ^= sort_copy(black_box(input));
    }
    acc
}

#[inline(never)]
fn light(input: &[u64]) -> u64 {
    sort_copy(black_box(input)) ^ 1
}

fn cpu_seconds() -> f64 {
    // CPU time, so a busy machine stretches the run rather than shrinking the sample
    let mut t = [0i64; 2];
    extern "C" {
        fn clock_gettime(clock: i32, t: *mut [i64; 2]) -> i32;
    }
    unsafe { clock_gettime(2, &mut t) }; // CLOCK_PROCESS_CPUTIME_ID
    t[0] as f64 + t[1] as f64 / 1e9
}

fn main() {
    let seconds: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let end = cpu_seconds() + seconds;
    let mut state: u64 = 0x9e3779b97f4a7c15;
    let mut acc = 0u64;
    while cpu_seconds() < end {
        for _ in 0..20 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let n = 64 + (state % 192) as usize;
            let input: Vec<u64> = (0..n as u64).map(|i| state.wrapping_mul(i + 1) >> 11).collect();
            acc ^= heavy(&input);
            acc ^= light(&input);
        }
    }
    println!("{}", acc & 1);
}
