//! Navigation over a scanned text: values are an index into the structural
//! index, their text a slice of the input.

use crate::{error, Error};
use std::borrow::Cow;

/// A validated JSON text and its structural index.
#[derive(Debug, Clone, Copy)]
pub struct Json<'t, 'i> {
    text: &'t str,
    structurals: &'i [u32],
    closes: &'i [u32],
}

impl<'t, 'i> Json<'t, 'i> {
    pub(crate) fn new(text: &'t str, structurals: &'i [u32], closes: &'i [u32]) -> Self {
        Json {
            text,
            structurals,
            closes,
        }
    }

    /// The text's one value.
    pub fn root(&self) -> Value<'t, 'i> {
        Value { json: *self, k: 0 }
    }

    /// The whole text.
    pub fn text(&self) -> &'t str {
        self.text
    }

    /// Structural bytes in the text (operators and scalar starts).
    pub fn structurals(&self) -> usize {
        self.structurals.len()
    }
}

/// What a value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `{…}`
    Object,
    /// `[…]`
    Array,
    /// `"…"`
    String,
    /// A number.
    Number,
    /// `true` or `false`.
    Bool,
    /// `null`.
    Null,
}

/// One value of a scanned text.
#[derive(Debug, Clone, Copy)]
pub struct Value<'t, 'i> {
    json: Json<'t, 'i>,
    /// Index of the value's first structural.
    k: usize,
}

const JSON_WHITESPACE: &[char] = &[' ', '\t', '\n', '\r'];

impl<'t, 'i> Value<'t, 'i> {
    fn start(&self) -> usize {
        self.json.structurals[self.k] as usize
    }

    fn first_byte(&self) -> u8 {
        self.json.text.as_bytes()[self.start()]
    }

    /// What this value is.
    pub fn kind(&self) -> Kind {
        match self.first_byte() {
            b'{' => Kind::Object,
            b'[' => Kind::Array,
            b'"' => Kind::String,
            b't' | b'f' => Kind::Bool,
            b'n' => Kind::Null,
            _ => Kind::Number,
        }
    }

    /// Index of the value's last structural (its close, for a container).
    fn last(&self) -> usize {
        match self.first_byte() {
            b'{' | b'[' => self.json.closes[self.k] as usize,
            _ => self.k,
        }
    }

    /// The value's exact text, from its first byte to its last.
    pub fn raw(&self) -> &'t str {
        let start = self.start();
        let text = self.json.text;
        match self.first_byte() {
            b'{' | b'[' => &text[start..=self.json.structurals[self.last()] as usize],
            // A scalar runs to the next structural, less the whitespace
            // before it (nothing else can stand between them).
            _ => {
                let end = self
                    .json
                    .structurals
                    .get(self.k + 1)
                    .map_or(text.len(), |&e| e as usize);
                text[start..end].trim_end_matches(JSON_WHITESPACE)
            }
        }
    }

    /// A string's contents, unescaped (borrowed from the text when it has no
    /// escapes). Fails on a value that is not a string, or on an escape that
    /// names half of a surrogate pair alone.
    pub fn to_str(&self) -> Result<Cow<'t, str>, Error> {
        let raw = self.raw();
        if self.kind() != Kind::String {
            return Err(error(self.start(), "not a string"));
        }
        let inner = &raw[1..raw.len() - 1];
        if !inner.contains('\\') {
            return Ok(Cow::Borrowed(inner));
        }
        serde_json::from_str::<String>(raw)
            .map(Cow::Owned)
            .map_err(|_| error(self.start(), "string escape names a lone surrogate"))
    }

    /// A number that is a whole number in `u64`'s range.
    pub fn as_u64(&self) -> Option<u64> {
        (self.kind() == Kind::Number)
            .then(|| self.raw().parse().ok())
            .flatten()
    }

    /// An array's elements in order (none for any other value).
    pub fn elements(&self) -> Elements<'t, 'i> {
        let (next, end) = self.children(b'[');
        Elements {
            json: self.json,
            next,
            end,
        }
    }

    /// An object's members in order, as (key, value) (none for any other
    /// value). Keys that repeat are handed out each time.
    pub fn members(&self) -> Members<'t, 'i> {
        let (next, end) = self.children(b'{');
        Members {
            json: self.json,
            next,
            end,
        }
    }

    /// The first member of an object named `key`.
    pub fn get(&self, key: &str) -> Option<Value<'t, 'i>> {
        self.members().find(|(k, _)| k.is_str(key)).map(|(_, v)| v)
    }

    /// Whether this is a string whose contents are `s`: compared in place
    /// when it has no escapes (as keys almost never do).
    pub fn is_str(&self, s: &str) -> bool {
        let text = self.json.text.as_bytes();
        let start = self.start();
        let end = start + s.len() + 1;
        if text.get(start) != Some(&b'"') {
            return false;
        }
        // Without a backslash in s, a quote right after it closes the string.
        if !s.contains('\\')
            && text.get(start + 1..end) == Some(s.as_bytes())
            && text.get(end) == Some(&b'"')
        {
            return true;
        }
        // Escapes in the key can spell s in other bytes.
        self.raw().contains('\\') && self.to_str().is_ok_and(|k| k == s)
    }

    /// The first child's index and the close's, for a container opened by
    /// `open`; an empty range otherwise.
    fn children(&self, open: u8) -> (usize, usize) {
        if self.first_byte() != open {
            return (0, 0);
        }
        let close = self.last();
        (self.k + 1, close)
    }
}

/// The elements of an array: [`Value::elements`].
#[derive(Debug, Clone)]
pub struct Elements<'t, 'i> {
    json: Json<'t, 'i>,
    next: usize,
    end: usize,
}

impl<'t, 'i> Iterator for Elements<'t, 'i> {
    type Item = Value<'t, 'i>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        let value = Value {
            json: self.json,
            k: self.next,
        };
        // After the value: a comma and the next element, or the close.
        self.next = value.last() + 2;
        Some(value)
    }
}

/// The members of an object: [`Value::members`].
#[derive(Debug, Clone)]
pub struct Members<'t, 'i> {
    json: Json<'t, 'i>,
    next: usize,
    end: usize,
}

impl<'t, 'i> Iterator for Members<'t, 'i> {
    type Item = (Value<'t, 'i>, Value<'t, 'i>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        let key = Value {
            json: self.json,
            k: self.next,
        };
        let value = Value {
            json: self.json,
            k: self.next + 2,
        };
        self.next = value.last() + 2;
        Some((key, value))
    }
}
