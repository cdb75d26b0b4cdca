// Multi-threaded Rust without frame pointers: std's thread start calls pthread_getattr_np,
// which reallocs while glibc holds the thread's lock.
use std::collections::HashMap;
use std::thread;

fn main() {
    let mut handles = Vec::new();
    for t in 0..4 {
        handles.push(thread::spawn(move || {
            let mut m: HashMap<u64, Vec<u8>> = HashMap::new();
            for i in 0..20_000u64 {
                m.insert(i, vec![t as u8; (i % 64) as usize]);
                if i % 3 == 0 {
                    m.remove(&(i / 2));
                }
            }
            m.len()
        }));
    }
    let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    println!("rust threads ok {}", total > 0);
}
