//! A chat / Anthropic `messages` array read in the same pass as the rest of
//! the body: each message's `role`, `content` and `tool_calls` are kept as
//! borrowed JSON, every other key is skipped. Before this, `messages` was
//! captured whole and parsed a second time, which scanned a long prompt twice.
//!
//! The reading matches what a `serde_json::Value` would give (a repeated key:
//! the last one wins; an element that is not an object has no fields), so the
//! rendered prompt is the same text either way.

use std::fmt;

use serde::{
    Deserialize, Deserializer,
    de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use serde_json::value::RawValue;

/// The `messages` field: an array of messages, or any other JSON value
/// (which has no prompt text).
#[derive(Debug, Default)]
pub(super) enum Messages<'a> {
    /// A JSON array.
    List(Vec<Message<'a>>),
    /// Not an array (null, a string, an object, ...).
    #[default]
    Other,
}

/// One element of the array (an element that is not an object has no fields).
#[derive(Debug, Default)]
pub(super) struct Message<'a> {
    pub(super) role: Option<&'a RawValue>,
    pub(super) content: Option<&'a RawValue>,
    pub(super) tool_calls: Option<&'a RawValue>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Messages<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MessagesVisitor)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Message<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MessageVisitor)
    }
}

/// The keys a message is read for.
enum Key {
    Role,
    Content,
    ToolCalls,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
        Ok(match key {
            "role" => Key::Role,
            "content" => Key::Content,
            "tool_calls" => Key::ToolCalls,
            _ => Key::Other,
        })
    }
}

/// Accepts any JSON value; `visit_map` and `visit_seq` are what matter, the
/// other shapes are consumed and read as "no fields".
macro_rules! scalars_are {
    ($value:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

struct MessagesVisitor;

impl<'de> Visitor<'de> for MessagesVisitor {
    type Value = Messages<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    scalars_are!(Messages::Other);

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut list = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(m) = seq.next_element::<Message<'de>>()? {
            list.push(m);
        }
        Ok(Messages::List(list))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Messages::Other)
    }
}

struct MessageVisitor;

impl<'de> Visitor<'de> for MessageVisitor {
    type Value = Message<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    scalars_are!(Message::default());

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Message::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut m = Message::default();
        while let Some(key) = map.next_key::<Key>()? {
            // A repeated key overwrites, as in a `serde_json::Value` map.
            match key {
                Key::Role => m.role = Some(map.next_value()?),
                Key::Content => m.content = Some(map.next_value()?),
                Key::ToolCalls => m.tool_calls = Some(map.next_value()?),
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(m)
    }
}
