//! Whole numbers in JSON bodies as JSON Schema means them: `3` and `3.0` are both the integer
//! 3 (a client that writes every number as a float is not wrong), a fraction is refused.
//! For the body fields the OpenAPI document declares `integer`.

use serde::{Deserialize, Deserializer};

/// A JSON number that is a whole, non-negative value within `max`.
fn whole<'de, D: Deserializer<'de>>(d: D, max: u64) -> Result<u64, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    let value = match (n.as_u64(), n.as_f64()) {
        (Some(v), _) => Some(v),
        (None, Some(f)) if f >= 0.0 && f.fract() == 0.0 && f <= max as f64 => Some(f as u64),
        _ => None,
    };
    value.filter(|v| *v <= max).ok_or_else(|| {
        serde::de::Error::custom(format!("expected a whole number from 0 to {max}, got {n}"))
    })
}

pub fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole(d, u64::MAX)
}

/// An absent or null value, or a whole number within `max` as a `T`.
fn opt<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D, max: u64) -> Result<Option<T>, D::Error> {
    let Some(v) = Option::<serde_json::Value>::deserialize(d)? else {
        return Ok(None);
    };
    let n = whole(v, max).map_err(serde::de::Error::custom)?;
    T::try_from(n)
        .map(Some)
        .map_err(|_| serde::de::Error::custom(format!("{n} is out of range")))
}

pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    opt(d, u64::MAX)
}

pub fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    opt(d, u32::MAX.into())
}

pub fn opt_usize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    opt(d, usize::MAX as u64)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct T {
        #[serde(deserialize_with = "super::u64")]
        n: u64,
        #[serde(default, deserialize_with = "super::opt_u32")]
        m: Option<u32>,
    }

    #[test]
    fn whole_floats_are_whole_numbers_and_fractions_are_not() {
        let t: T = serde_json::from_str(r#"{"n": 2506370.0, "m": 3}"#).unwrap();
        assert_eq!((t.n, t.m), (2506370, Some(3)));
        let t: T = serde_json::from_str(r#"{"n": 7, "m": null}"#).unwrap();
        assert_eq!((t.n, t.m), (7, None));
        assert!(serde_json::from_str::<T>(r#"{"n": 1.5}"#).is_err());
        assert!(serde_json::from_str::<T>(r#"{"n": -1}"#).is_err());
        assert!(serde_json::from_str::<T>(r#"{"n": 1, "m": 5000000000}"#).is_err());
    }
}
