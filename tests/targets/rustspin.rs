// Rust target for demangling: a function in a module burns the CPU.
mod physics {
    #[inline(never)]
    pub fn integrate_orbits(rounds: u64) -> u64 {
        let mut x: u64 = 1;
        for i in 0..rounds {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        std::hint::black_box(x)
    }
}

fn main() {
    let seconds: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let end = std::time::Instant::now() + std::time::Duration::from_secs_f64(seconds);
    let mut acc = 0u64;
    while std::time::Instant::now() < end {
        acc = acc.wrapping_add(physics::integrate_orbits(1_000_000));
    }
    std::hint::black_box(acc);
}
