//! Human-readable numbers: bytes, rates and times.

/// `1536` → `1.5 KiB`.
pub fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut u = 0;
    while v.abs() >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else if v.fract().abs() < 1e-9 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `2_500_000.0` → `2.50 M`.
pub fn si(n: f64) -> String {
    let a = n.abs();
    if a >= 1e9 {
        format!("{:.2} G", n / 1e9)
    } else if a >= 1e6 {
        format!("{:.2} M", n / 1e6)
    } else if a >= 1e3 {
        format!("{:.1} k", n / 1e3)
    } else if a >= 100.0 || n.fract() == 0.0 {
        format!("{n:.0}")
    } else {
        format!("{n:.2}")
    }
}

/// A time for people: [`daqflow_api::utc`].
pub fn utc(ns: u64) -> String {
    daqflow_api::utc(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes(64.0), "64 B");
        assert_eq!(bytes(1024.0), "1 KiB");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(1048576.0), "1 MiB");
        assert_eq!(si(2_500_000.0), "2.50 M");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_795_317_309_000_000_000), "2026-11-22 03:15:09 UTC");
        assert_eq!(utc(951_782_400_000_000_000), "2000-02-29 00:00:00 UTC");
    }
}
