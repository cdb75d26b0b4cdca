// heap_rust: allocations through Rust's std (Vec, String, HashMap), built without
// force-frame-pointers (std itself has none). Keeps 1000 Vec<u8> of 100 bytes made in
// keep_vecs() and 500 Strings of capacity 64 made in keep_strings(); nothing is freed.
use std::hint::black_box;

#[inline(never)]
fn keep_vecs(kept: &mut Vec<Vec<u8>>, n: usize) {
    for i in 0..n {
        kept.push(vec![(i % 251) as u8 + 1; 100]);
    }
}

#[inline(never)]
fn keep_strings(kept: &mut Vec<String>, n: usize) {
    for i in 0..n {
        let mut s = String::with_capacity(64);
        s.push_str(if i % 2 == 0 { "even" } else { "odd" });
        kept.push(s);
    }
}

fn main() {
    let mut vecs: Vec<Vec<u8>> = Vec::with_capacity(1000);
    let mut strings: Vec<String> = Vec::with_capacity(500);
    keep_vecs(&mut vecs, black_box(1000));
    keep_strings(&mut strings, black_box(500));
    println!("rust heap ok {} {}", vecs.len(), strings.len());
    std::mem::forget(vecs);
    std::mem::forget(strings);
}
