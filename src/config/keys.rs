//! Every key the config file accepts, read from the raw serde structs themselves, so the
//! documentation (`docs/configuration.md`, held true by `tests/it/product/docs.rs`) cannot fall behind a
//! key added to the file format.
//!
//! A serde derive passes the list of its fields to `deserialize_struct`; [`known_keys`] walks
//! [`RawConfig`] with a deserializer that records those lists path by path and answers every
//! value with a placeholder of the asked type (the first variant of an enum, one element of
//! an array), so each nested table is visited once.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};
use serde::Deserialize;

use super::raw::RawConfig;

/// The walk over the raw structs failed: a raw type asked for something the recorder cannot
/// answer (a bug in this module, never a user's input).
#[derive(Debug, thiserror::Error)]
#[error("cannot list the config keys: {0}")]
pub struct KeysError(String);

impl de::Error for KeysError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        KeysError(msg.to_string())
    }
}

/// The dotted paths of every leaf key the config accepts, sorted: `server.listen`,
/// `provider.region.base_url`, `route.price.currency`, … Arrays of tables have no index
/// (`[[route]]`'s keys are `route.*`); a key whose value is itself a table is not listed,
/// its keys are.
pub fn known_keys() -> Result<Vec<String>, KeysError> {
    let seen = Seen::default();
    RawConfig::deserialize(Recorder {
        path: String::new(),
        seen: &seen,
    })?;
    let tables = seen.tables.into_inner();
    Ok(seen
        .keys
        .into_inner()
        .into_iter()
        .filter(|k| !tables.contains(k))
        .collect())
}

#[derive(Default)]
struct Seen {
    /// Every field of every struct, as a dotted path.
    keys: RefCell<BTreeSet<String>>,
    /// The paths whose value is a struct (tables, not leaves).
    tables: RefCell<BTreeSet<String>>,
}

struct Recorder<'s> {
    path: String,
    seen: &'s Seen,
}

impl<'s> Recorder<'s> {
    fn child(&self, field: &str) -> Recorder<'s> {
        let path = if self.path.is_empty() {
            field.to_owned()
        } else {
            format!("{}.{field}", self.path)
        };
        Recorder {
            path,
            seen: self.seen,
        }
    }
}

macro_rules! placeholder {
    ($($method:ident => $visit:ident($value:expr)),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, KeysError> {
            v.$visit($value)
        })*
    };
}

impl<'de> de::Deserializer<'de> for Recorder<'_> {
    type Error = KeysError;

    // A value of no declared type (e.g. `buckets`, which takes a word or an array): a word.
    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, KeysError> {
        v.visit_str("")
    }

    placeholder! {
        deserialize_bool => visit_bool(false),
        deserialize_i8 => visit_i8(0),
        deserialize_i16 => visit_i16(0),
        deserialize_i32 => visit_i32(0),
        deserialize_i64 => visit_i64(0),
        deserialize_u8 => visit_u8(0),
        deserialize_u16 => visit_u16(0),
        deserialize_u32 => visit_u32(0),
        deserialize_u64 => visit_u64(0),
        deserialize_f32 => visit_f32(0.0),
        deserialize_f64 => visit_f64(0.0),
        deserialize_char => visit_char(' '),
        deserialize_str => visit_str(""),
        deserialize_string => visit_str(""),
        deserialize_identifier => visit_str(""),
        deserialize_bytes => visit_bytes(&[]),
        deserialize_byte_buf => visit_bytes(&[]),
    }

    fn deserialize_unit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, KeysError> {
        v.visit_unit()
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, KeysError> {
        v.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, KeysError> {
        v.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, KeysError> {
        v.visit_newtype_struct(self)
    }

    // One element: every element of an array has the same keys.
    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, KeysError> {
        v.visit_seq(OneElement(Some(self)))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, v: V) -> Result<V::Value, KeysError> {
        self.deserialize_seq(v)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        v: V,
    ) -> Result<V::Value, KeysError> {
        self.deserialize_seq(v)
    }

    // A map with free keys (none in the config today): no fixed key to record.
    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, KeysError> {
        v.visit_map(serde::de::value::MapDeserializer::new(std::iter::empty::<(
            &str,
            &str,
        )>()))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, KeysError> {
        if !self.path.is_empty() {
            self.seen.tables.borrow_mut().insert(self.path.clone());
        }
        let mut keys = self.seen.keys.borrow_mut();
        for field in fields {
            keys.insert(self.child(field).path);
        }
        drop(keys);
        v.visit_map(Fields {
            parent: self,
            fields: fields.iter(),
            current: "",
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, KeysError> {
        let first = variants
            .first()
            .ok_or_else(|| KeysError(format!("{}: an enum without variants", self.path)))?;
        v.visit_enum(first.into_deserializer())
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, KeysError> {
        v.visit_unit()
    }
}

/// A struct's fields, each with a placeholder value recorded under its own path.
struct Fields<'s> {
    parent: Recorder<'s>,
    fields: std::slice::Iter<'static, &'static str>,
    current: &'static str,
}

impl<'de> de::MapAccess<'de> for Fields<'_> {
    type Error = KeysError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, KeysError> {
        match self.fields.next() {
            Some(field) => {
                self.current = field;
                let key: de::value::StrDeserializer<'_, KeysError> = field.into_deserializer();
                seed.deserialize(key).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, KeysError> {
        seed.deserialize(self.parent.child(self.current))
    }
}

struct OneElement<'s>(Option<Recorder<'s>>);

impl<'de> de::SeqAccess<'de> for OneElement<'_> {
    type Error = KeysError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, KeysError> {
        self.0.take().map(|r| seed.deserialize(r)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_leaves_of_nested_tables_and_arrays_of_tables() {
        let keys = known_keys().unwrap();
        for k in [
            "server.listen",
            "provider.region.base_url",
            "route.price.currency",
            "proxy.breaker.open_for",
            "alert.dingtalk.webhook_env",
            "contract.degraded.reject",
            "detection.buckets",
        ] {
            assert!(keys.iter().any(|x| x == k), "{k} missing from {keys:?}");
        }
        // Tables are not leaves.
        for t in [
            "server",
            "provider.region",
            "route.price",
            "proxy.breaker",
            "alert",
        ] {
            assert!(!keys.iter().any(|x| x == t), "{t} listed as a key");
        }
    }
}
