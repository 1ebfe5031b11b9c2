//! Kubernetes quantities (`500m`, `36Gi`, `8`) and Go-style durations (`1h30m`, `90s`).
//!
//! Quantities are kept as signed milli-units in an `i64`, exact for every value a queue
//! can hold (up to about 9 PB of memory). Time in the engine is milliseconds since the
//! start of a scenario or the epoch of the caller's choice: the engine never reads a clock.

use super::error::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A point in time, in milliseconds, chosen by the caller (the engine never reads a clock).
pub type Time = u64;

/// A resource amount in milli-units (`1` CPU = `1000`, `1Gi` = `1073741824000`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(pub i64);

impl Quantity {
    /// The amount of `n` whole units.
    pub fn units(n: i64) -> Self {
        Quantity(n.saturating_mul(1000))
    }

    /// Parses `8`, `0.5`, `500m`, `36Gi`, `1e3`, `10M` into milli-units.
    pub fn parse(s: &str) -> Result<Self> {
        let err = |why: &str| Error::Quantity {
            value: s.to_string(),
            why: why.to_string(),
        };
        let t = s.trim();
        if t.is_empty() {
            return Err(err("empty"));
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
            .unwrap_or(t.len());
        let (num, suffix) = t.split_at(split);
        if num.is_empty() {
            return Err(err("missing number"));
        }
        // Multiplier as (numerator, denominator) relative to milli-units.
        let (mul, div): (i128, i128) = match suffix {
            "" => (1000, 1),
            "m" => (1, 1),
            "k" => (1000 * 1000, 1),
            "M" => (1000 * 1_000_000, 1),
            "G" => (1000 * 1_000_000_000, 1),
            "T" => (1000 * 1_000_000_000_000, 1),
            "P" => (1000 * 1_000_000_000_000_000, 1),
            "Ki" => (1000 << 10, 1),
            "Mi" => (1000 << 20, 1),
            "Gi" => (1000 << 30, 1),
            "Ti" => (1000 << 40, 1),
            "Pi" => (1000 << 50, 1),
            s if s.starts_with('e') || s.starts_with('E') => {
                let exp: u32 = s[1..].parse().map_err(|_| err("bad exponent"))?;
                if exp > 15 {
                    return Err(err("exponent too large"));
                }
                (1000 * 10i128.pow(exp), 1)
            }
            _ => return Err(err("unknown suffix")),
        };
        let (int_part, frac_part) = match num.split_once('.') {
            Some((i, f)) => (i, f),
            None => (num, ""),
        };
        let negative = int_part.starts_with('-');
        let int_digits = int_part.trim_start_matches(['-', '+']);
        if int_digits.is_empty() && frac_part.is_empty() {
            return Err(err("missing number"));
        }
        if !int_digits.chars().all(|c| c.is_ascii_digit())
            || !frac_part.chars().all(|c| c.is_ascii_digit())
            || frac_part.len() > 9
        {
            return Err(err("bad number"));
        }
        let int_val: i128 = if int_digits.is_empty() {
            0
        } else {
            int_digits.parse().map_err(|_| err("number too large"))?
        };
        let frac_scale = 10i128.pow(frac_part.len() as u32);
        let frac_val: i128 = if frac_part.is_empty() {
            0
        } else {
            frac_part.parse().map_err(|_| err("bad fraction"))?
        };
        let scaled = (int_val * frac_scale + frac_val)
            .checked_mul(mul)
            .ok_or_else(|| err("too large"))?;
        // Round up like Kubernetes does for sub-milli precision.
        let denom = frac_scale * div;
        let mut milli = (scaled + denom - 1) / denom;
        if negative {
            milli = -milli;
        }
        let milli = i64::try_from(milli).map_err(|_| err("too large"))?;
        Ok(Quantity(milli))
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 % 1000 == 0 {
            write!(f, "{}", self.0 / 1000)
        } else {
            write!(f, "{}m", self.0)
        }
    }
}

/// A Kubernetes quantity in a CRD schema: an integer or a string (`8`, `500m`, `36Gi`).
impl schemars::JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "x-kubernetes-int-or-string": true })
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Float(f64),
            Str(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::Int(i) => i.to_string(),
            Raw::Float(f) => f.to_string(),
            Raw::Str(s) => s,
        };
        Quantity::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Parses a Go-style duration (`1h30m`, `90s`, `500ms`, `2m0s`) or a bare number of
/// seconds (`90`, `1.5`) into milliseconds.
pub fn parse_duration(s: &str) -> Result<Time> {
    let err = |why: &str| Error::Duration {
        value: s.to_string(),
        why: why.to_string(),
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(err("empty"));
    }
    // About 300 years: far beyond any plan, far below overflow when added to times.
    const MAX_MS: f64 = 1e13;
    if let Ok(secs) = t.parse::<f64>() {
        if !(secs.is_finite() && secs >= 0.0) {
            return Err(err("must be a non-negative number of seconds"));
        }
        if secs * 1000.0 > MAX_MS {
            return Err(err("too large"));
        }
        return Ok((secs * 1000.0).round() as Time);
    }
    let mut total: f64 = 0.0;
    let mut rest = t;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("missing unit (h, m, s, ms)"))?;
        if n == 0 {
            return Err(err("expected a number"));
        }
        let value: f64 = rest[..n].parse().map_err(|_| err("bad number"))?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..u] {
            "h" => 3_600_000.0,
            "m" => 60_000.0,
            "s" => 1000.0,
            "ms" => 1.0,
            _ => return Err(err("unknown unit (use h, m, s, ms)")),
        };
        rest = &rest[u..];
        total += value * factor;
    }
    if total > MAX_MS {
        return Err(err("too large"));
    }
    Ok(total.round() as Time)
}

/// Formats milliseconds as a short Go-style duration (`1h2m3s`, `250ms`).
pub fn format_duration(ms: Time) -> String {
    if ms == 0 {
        return "0s".to_string();
    }
    let (h, rem) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rem) = (rem / 60_000, rem % 60_000);
    let (s, milli) = (rem / 1000, rem % 1000);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if milli > 0 && h == 0 && m == 0 && s == 0 {
        out.push_str(&format!("{milli}ms"));
    } else if s > 0 || milli > 0 {
        if milli > 0 {
            out.push_str(&format!("{s}.{milli:03}s"));
        } else {
            out.push_str(&format!("{s}s"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_to_milli_units() {
        let cases = [
            ("8", 8000),
            ("0.5", 500),
            ("500m", 500),
            ("1Ki", 1024 * 1000),
            ("36Gi", 36 * (1i64 << 30) * 1000),
            ("1k", 1_000_000),
            ("1e3", 1_000_000),
            ("1.5", 1500),
            ("-2", -2000),
        ];
        for (text, want) in cases {
            assert_eq!(Quantity::parse(text), Ok(Quantity(want)), "{text}");
        }
    }

    #[test]
    fn bad_quantities_are_errors_not_panics() {
        for text in ["", "Gi", "1.2.3", "5X", "1e99", "99999999999999999999P"] {
            assert!(Quantity::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn durations_parse_go_style_and_seconds() {
        let cases = [
            ("90s", 90_000),
            ("1h30m", 5_400_000),
            ("500ms", 500),
            ("2m0s", 120_000),
            ("90", 90_000),
            ("1.5", 1500),
            ("0s", 0),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for text in ["", "5x", "h", "-1", "1h-", "1e30", "99999999999h"] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
    }

    #[test]
    fn durations_format_round_trip() {
        for ms in [0, 250, 1000, 61_000, 3_600_000, 5_400_500] {
            assert_eq!(parse_duration(&format_duration(ms)), Ok(ms), "{ms}");
        }
    }
}
