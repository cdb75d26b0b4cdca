// Target for tests/system/test_symbols.py, built once with legacy and once with v0 symbol mangling.
mod engine {
    pub struct Counter {
        pub total: u64,
    }

    impl Counter {
        #[inline(never)]
        pub fn crunch(&mut self, n: u64) -> u64 {
            for i in 0..n {
                self.total = self.total.wrapping_mul(31).wrapping_add(i); // CRUNCH_LOOP
            }
            self.total
        }
    }
}

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let mut c = engine::Counter { total: 1 };
    println!("{}", c.crunch(n));
}
