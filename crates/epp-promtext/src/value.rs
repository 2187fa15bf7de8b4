//! Number parsing: an exact fast path for the short decimals model servers
//! print (`12.0`, `0.4215`, `1.7624e+09`, `4096`), the standard library for
//! everything else.

/// Exact powers of ten representable in an `f64`.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Parses a Prometheus / OpenMetrics number: decimal with optional sign,
/// fraction and exponent, or `NaN`, `Inf`, `+Inf`, `-Inf`, `infinity`
/// (case-insensitive, as OpenMetrics' ABNF allows).
///
/// With at most 15 significant digits and a decimal exponent within ±22 both
/// the mantissa and the power of ten are exact, so one IEEE multiplication or
/// division is correctly rounded (Clinger's fast path); other inputs go to
/// `str::parse`, which is correctly rounded too.
pub(crate) fn parse_f64(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let (neg, mut i) = match b.first() {
        Some(b'-') => (true, 1),
        Some(b'+') => (false, 1),
        _ => (false, 0),
    };
    let mut mant: u64 = 0;
    let int_start = i;
    while let Some(&d) = b.get(i).filter(|d| d.is_ascii_digit()) {
        mant = mant.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
        i += 1;
    }
    let mut digits = i - int_start;
    let mut frac = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let frac_start = i;
        while let Some(&d) = b.get(i).filter(|d| d.is_ascii_digit()) {
            mant = mant.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
            i += 1;
        }
        frac = i - frac_start;
        digits += frac;
    }
    if digits == 0 || digits > 15 {
        return slow(s);
    }
    let mut exp: i32 = 0;
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        let exp_neg = match b.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let exp_start = i;
        while let Some(&d) = b.get(i).filter(|d| d.is_ascii_digit()) {
            exp = exp * 10 + i32::from(d - b'0');
            i += 1;
            if i - exp_start > 4 {
                return slow(s);
            }
        }
        if i == exp_start {
            return None;
        }
        if exp_neg {
            exp = -exp;
        }
    }
    if i != b.len() {
        return slow(s);
    }
    let e = exp - i32::try_from(frac).unwrap_or(i32::MAX);
    #[expect(clippy::cast_precision_loss, reason = "mant < 10^15 < 2^53 is exact")]
    let m = mant as f64;
    let v = match usize::try_from(e.unsigned_abs())
        .ok()
        .and_then(|k| POW10.get(k))
    {
        Some(p) if e >= 0 => m * p,
        Some(p) => m / p,
        None => return slow(s),
    };
    Some(if neg { -v } else { v })
}

#[cold]
fn slow(s: &str) -> Option<f64> {
    // `str::parse` accepts what Go's `strconv.ParseFloat` accepts for decimals,
    // plus `inf`/`infinity`/`nan` in any case; it rejects empty text.
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_path_agrees_with_std() {
        for s in [
            "0",
            "12.0",
            "-0.0",
            "0.4215",
            "1.7624e+09",
            "1.762400123456e+09",
            "4096",
            "+3",
            "1e22",
            "1e-22",
            "123456789012345",
            "0.1",
            "2.5E-3",
            ".5",
            "5.",
            "1234567890123456789",
            "1e300",
            "4.9e-324",
            "0.000000000000000000000000001",
        ] {
            let want: f64 = s.parse().unwrap();
            let got = parse_f64(s).unwrap();
            assert_eq!(got.to_bits(), want.to_bits(), "{s}");
        }
    }

    #[test]
    fn specials_and_rejects() {
        assert_eq!(parse_f64("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_f64("-Inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_f64("infinity"), Some(f64::INFINITY));
        assert!(parse_f64("NaN").is_some_and(f64::is_nan));
        for bad in [
            "", "-", ".", "e5", "1e", "1e+", "one", "1.2.3", "0x10", "1_000", "1 ",
        ] {
            assert_eq!(parse_f64(bad), None, "{bad:?}");
        }
    }
}
