//! The predicate language of `sluice query` and the scan operators.
//!
//! ```text
//! predicate := or
//! or        := and ("OR" and)*
//! and       := not ("AND" not)*
//! not       := "NOT" not | "(" predicate ")" | test
//! test      := path op literal
//!            | path "BETWEEN" literal "AND" literal      (inclusive)
//!            | path "IN" "(" literal ("," literal)* ")"
//!            | path "PREFIX" string
//!            | path "CONTAINS" string                     (substring)
//!            | "EXISTS" path
//! path      := name ("." name | "[" digits "]")*
//! op        := "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
//! literal   := number | string | "true" | "false" | "null"
//! ```
//!
//! Keywords are case-insensitive; strings take single or double quotes
//! with `\` escapes. A parse error names the column and what was expected.

use std::fmt;

/// Most tests (comparisons, IN lists, ...) one predicate may hold.
pub const MAX_TESTS: usize = 256;
/// Most values one IN list may hold.
pub const MAX_IN_VALUES: usize = 1024;
/// Deepest nesting of parentheses and NOTs.
pub const MAX_DEPTH: usize = 64;

/// A constant of a predicate.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// An integer.
    Int(i64),
    /// A number with a fraction or exponent.
    Float(f64),
    /// A string.
    Str(String),
    /// `true` or `false`.
    Bool(bool),
    /// `null`.
    Null,
}

/// One step of a path: an object member or an array element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// An object member by name.
    Key(String),
    /// An array element by position.
    Index(usize),
}

/// A field path: `meta.pages`, `authors[0]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    /// The steps from the document's root.
    pub steps: Vec<Step>,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.steps.iter().enumerate() {
            match s {
                Step::Key(k) if i == 0 => write!(f, "{k}")?,
                Step::Key(k) => write!(f, ".{k}")?,
                Step::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `=` (or `==`).
    Eq,
    /// `!=` (or `<>`).
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
}

/// A parsed predicate (see the grammar above).
#[derive(Debug, Clone, PartialEq)]
pub enum Predicate {
    /// `path op literal`.
    Cmp {
        /// The field.
        path: Path,
        /// The operator.
        op: CmpOp,
        /// The constant.
        value: Literal,
    },
    /// `path BETWEEN low AND high`, both ends included.
    Between {
        /// The field.
        path: Path,
        /// The lower end.
        low: Literal,
        /// The upper end.
        high: Literal,
    },
    /// `path IN (v, ...)`.
    In {
        /// The field.
        path: Path,
        /// The values.
        values: Vec<Literal>,
    },
    /// `path PREFIX 'text'`: a string field starting with it.
    Prefix {
        /// The field.
        path: Path,
        /// The prefix.
        prefix: String,
    },
    /// A string field holding `text` anywhere.
    Contains {
        /// The field.
        path: Path,
        /// The text.
        text: String,
    },
    /// `EXISTS path`: the field is present (null included).
    Exists(Path),
    /// Every part holds.
    And(Vec<Predicate>),
    /// Some part holds.
    Or(Vec<Predicate>),
    /// The part does not hold.
    Not(Box<Predicate>),
}

impl Predicate {
    /// Every path the predicate reads, in order of appearance.
    pub fn paths(&self) -> Vec<&Path> {
        let mut out = Vec::new();
        self.collect_paths(&mut out);
        out
    }

    fn collect_paths<'a>(&'a self, out: &mut Vec<&'a Path>) {
        match self {
            Predicate::Cmp { path, .. }
            | Predicate::Between { path, .. }
            | Predicate::In { path, .. }
            | Predicate::Prefix { path, .. }
            | Predicate::Contains { path, .. }
            | Predicate::Exists(path) => out.push(path),
            Predicate::And(ps) | Predicate::Or(ps) => {
                ps.iter().for_each(|p| p.collect_paths(out));
            }
            Predicate::Not(p) => p.collect_paths(out),
        }
    }
}

/// A predicate that does not parse: where, and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?}, column {column}: {message}")]
pub struct ParseError {
    /// The text parsed.
    pub text: String,
    /// 1-based, in characters.
    pub column: usize,
    /// What was expected and what was found.
    pub message: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Name(String),
    Str(String),
    Int(i64),
    Float(f64),
    Op(&'static str),
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Dot,
    End,
}

impl Token {
    fn describe(&self) -> String {
        match self {
            Token::Name(n) => format!("{n:?}"),
            Token::Str(s) => format!("the string {s:?}"),
            Token::Int(n) => format!("the number {n}"),
            Token::Float(x) => format!("the number {x}"),
            Token::Op(o) => format!("{o:?}"),
            Token::LParen => "\"(\"".into(),
            Token::RParen => "\")\"".into(),
            Token::LBracket => "\"[\"".into(),
            Token::RBracket => "\"]\"".into(),
            Token::Comma => "\",\"".into(),
            Token::Dot => "\".\"".into(),
            Token::End => "the end".into(),
        }
    }

    fn is_keyword(&self, kw: &str) -> bool {
        matches!(self, Token::Name(n) if n.eq_ignore_ascii_case(kw))
    }
}

/// Tokens with the byte offset each starts at.
fn tokenize(text: &str) -> Result<Vec<(Token, usize)>, (usize, String)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let tok = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'(' => Token::LParen,
            b')' => Token::RParen,
            b'[' => Token::LBracket,
            b']' => Token::RBracket,
            b',' => Token::Comma,
            b'.' if !b.get(i + 1).is_some_and(u8::is_ascii_digit) => Token::Dot,
            b'=' | b'!' | b'<' | b'>' => {
                let two = b.get(i..i + 2).unwrap_or(&[]);
                let (op, len) = match two {
                    b"==" => ("=", 2),
                    b"!=" | b"<>" => ("!=", 2),
                    b"<=" => ("<=", 2),
                    b">=" => (">=", 2),
                    _ => match c {
                        b'=' => ("=", 1),
                        b'<' => ("<", 1),
                        b'>' => (">", 1),
                        _ => return Err((i, "\"!\" must be followed by \"=\"".into())),
                    },
                };
                i += len;
                out.push((Token::Op(op), start));
                continue;
            }
            b'"' | b'\'' => {
                let (s, end) = string_at(text, i)?;
                i = end;
                out.push((Token::Str(s), start));
                continue;
            }
            b'-' | b'0'..=b'9' | b'.' => {
                let (t, end) = number_at(text, i)?;
                i = end;
                out.push((t, start));
                continue;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                out.push((Token::Name(text[start..i].to_string()), start));
                continue;
            }
            _ => {
                let ch = text[i..].chars().next().unwrap_or('?');
                return Err((i, format!("unexpected character {ch:?}")));
            }
        };
        i += 1;
        out.push((tok, start));
    }
    out.push((Token::End, text.len()));
    Ok(out)
}

fn string_at(text: &str, start: usize) -> Result<(String, usize), (usize, String)> {
    let quote = text.as_bytes()[start] as char;
    let mut out = String::new();
    let mut chars = text[start + 1..].char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            c if c == quote => return Ok((out, start + 1 + at + 1)),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, c @ ('\\' | '"' | '\''))) => out.push(c),
                Some((at2, c)) => {
                    return Err((start + 1 + at2, format!("unknown escape \"\\{c}\"")));
                }
                None => break,
            },
            c => out.push(c),
        }
    }
    Err((start, "string is not closed".into()))
}

fn number_at(text: &str, start: usize) -> Result<(Token, usize), (usize, String)> {
    let b = text.as_bytes();
    let mut i = start;
    if b[i] == b'-' {
        i += 1;
    }
    let mut float = false;
    while i < b.len() {
        match b[i] {
            b'0'..=b'9' => {}
            b'.' | b'e' | b'E' => float = true,
            b'+' | b'-' if matches!(b[i - 1], b'e' | b'E') => {}
            _ => break,
        }
        i += 1;
    }
    let s = &text[start..i];
    let bad = || (start, format!("{s:?} is not a number"));
    let tok = if float {
        let x: f64 = s.parse().map_err(|_| bad())?;
        // A literal past f64's range parses as infinity, which no literal
        // can spell: refuse it rather than compare with infinity.
        if !x.is_finite() {
            return Err((
                start,
                format!("{s:?} is beyond the range of a 64-bit float"),
            ));
        }
        Token::Float(x)
    } else {
        Token::Int(s.parse().map_err(|_| bad())?)
    };
    Ok((tok, i))
}

struct Parser {
    tokens: Vec<(Token, usize)>,
    at: usize,
    tests: usize,
    depth: usize,
}

type PResult<T> = Result<T, (usize, String)>;

impl Parser {
    fn peek(&self) -> &Token {
        &self.tokens[self.at].0
    }

    fn offset(&self) -> usize {
        self.tokens[self.at].1
    }

    fn next(&mut self) -> Token {
        let t = self.tokens[self.at].0.clone();
        if self.at + 1 < self.tokens.len() {
            self.at += 1;
        }
        t
    }

    fn fail<T>(&self, expected: &str) -> PResult<T> {
        Err((
            self.offset(),
            format!("expected {expected}, found {}", self.peek().describe()),
        ))
    }

    fn keyword(&mut self, kw: &str) -> bool {
        if self.peek().is_keyword(kw) {
            self.next();
            true
        } else {
            false
        }
    }

    #[expect(clippy::expect_used, reason = "the loop leaves exactly one part")]
    fn or(&mut self) -> PResult<Predicate> {
        let mut parts = vec![self.and()?];
        while self.keyword("OR") {
            parts.push(self.and()?);
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one")
        } else {
            Predicate::Or(parts)
        })
    }

    #[expect(clippy::expect_used, reason = "the loop leaves exactly one part")]
    fn and(&mut self) -> PResult<Predicate> {
        let mut parts = vec![self.not()?];
        while self.keyword("AND") {
            parts.push(self.not()?);
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one")
        } else {
            Predicate::And(parts)
        })
    }

    fn not(&mut self) -> PResult<Predicate> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err((self.offset(), format!("nested deeper than {MAX_DEPTH}")));
        }
        let p = if self.keyword("NOT") {
            Predicate::Not(Box::new(self.not()?))
        } else if *self.peek() == Token::LParen {
            self.next();
            let p = self.or()?;
            if *self.peek() != Token::RParen {
                return self.fail("\")\"");
            }
            self.next();
            p
        } else {
            self.test()?
        };
        self.depth -= 1;
        Ok(p)
    }

    fn test(&mut self) -> PResult<Predicate> {
        self.tests += 1;
        if self.tests > MAX_TESTS {
            return Err((self.offset(), format!("more than {MAX_TESTS} tests")));
        }
        if self.keyword("EXISTS") {
            return Ok(Predicate::Exists(self.path()?));
        }
        let path = self.path()?;
        if let Token::Op(op) = self.peek().clone() {
            self.next();
            let op = match op {
                "=" => CmpOp::Eq,
                "!=" => CmpOp::Ne,
                "<" => CmpOp::Lt,
                "<=" => CmpOp::Le,
                ">" => CmpOp::Gt,
                _ => CmpOp::Ge,
            };
            return Ok(Predicate::Cmp {
                path,
                op,
                value: self.literal()?,
            });
        }
        if self.keyword("BETWEEN") {
            let low = self.literal()?;
            if !self.keyword("AND") {
                return self.fail("AND (BETWEEN low AND high)");
            }
            let high = self.literal()?;
            return Ok(Predicate::Between { path, low, high });
        }
        if self.keyword("IN") {
            return Ok(Predicate::In {
                path,
                values: self.in_list()?,
            });
        }
        if self.keyword("PREFIX") {
            return match self.next() {
                Token::Str(prefix) => Ok(Predicate::Prefix { path, prefix }),
                _ => {
                    self.at -= 1;
                    self.fail("a string after PREFIX")
                }
            };
        }
        if self.keyword("CONTAINS") {
            return match self.next() {
                Token::Str(text) => Ok(Predicate::Contains { path, text }),
                _ => {
                    self.at -= 1;
                    self.fail("a string after CONTAINS")
                }
            };
        }
        self.fail("a comparison (=, !=, <, <=, >, >=), BETWEEN, IN, PREFIX or CONTAINS")
    }

    fn in_list(&mut self) -> PResult<Vec<Literal>> {
        if *self.peek() != Token::LParen {
            return self.fail("\"(\" after IN");
        }
        self.next();
        let mut values = vec![self.literal()?];
        while *self.peek() == Token::Comma {
            self.next();
            values.push(self.literal()?);
            if values.len() > MAX_IN_VALUES {
                return Err((
                    self.offset(),
                    format!("more than {MAX_IN_VALUES} values in IN"),
                ));
            }
        }
        if *self.peek() != Token::RParen {
            return self.fail("\",\" or \")\" in the IN list");
        }
        self.next();
        Ok(values)
    }

    fn path(&mut self) -> PResult<Path> {
        let mut steps = match self.peek().clone() {
            Token::Name(n) if !is_reserved(&n) => {
                self.next();
                vec![Step::Key(n)]
            }
            _ => return self.fail("a field name"),
        };
        loop {
            match self.peek() {
                Token::Dot => {
                    self.next();
                    match self.next() {
                        Token::Name(n) => steps.push(Step::Key(n)),
                        _ => {
                            self.at -= 1;
                            return self.fail("a field name after \".\"");
                        }
                    }
                }
                Token::LBracket => {
                    self.next();
                    let n = match self.next() {
                        Token::Int(n) if n >= 0 => n as usize,
                        _ => {
                            self.at -= 1;
                            return self.fail("an array index (0 or more)");
                        }
                    };
                    if *self.peek() != Token::RBracket {
                        return self.fail("\"]\"");
                    }
                    self.next();
                    steps.push(Step::Index(n));
                }
                _ => return Ok(Path { steps }),
            }
        }
    }

    fn literal(&mut self) -> PResult<Literal> {
        let lit = match self.peek().clone() {
            Token::Int(n) => Literal::Int(n),
            Token::Float(x) => Literal::Float(x),
            Token::Str(s) => Literal::Str(s),
            t if t.is_keyword("true") => Literal::Bool(true),
            t if t.is_keyword("false") => Literal::Bool(false),
            t if t.is_keyword("null") => Literal::Null,
            _ => return self.fail("a value (a number, a quoted string, true, false or null)"),
        };
        self.next();
        Ok(lit)
    }
}

fn is_reserved(name: &str) -> bool {
    [
        "AND", "OR", "NOT", "IN", "BETWEEN", "PREFIX", "CONTAINS", "EXISTS",
    ]
    .iter()
    .any(|k| name.eq_ignore_ascii_case(k))
}

/// Parses a predicate.
pub fn parse(text: &str) -> Result<Predicate, ParseError> {
    let error = |(offset, message): (usize, String)| ParseError {
        text: text.to_string(),
        column: text[..offset.min(text.len())].chars().count() + 1,
        message,
    };
    let tokens = tokenize(text).map_err(error)?;
    let mut p = Parser {
        tokens,
        at: 0,
        tests: 0,
        depth: 0,
    };
    let pred = p.or().map_err(error)?;
    if *p.peek() != Token::End {
        return Err(error((
            p.offset(),
            format!("expected AND, OR or the end, found {}", p.peek().describe()),
        )));
    }
    Ok(pred)
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Int(n) => write!(f, "{n}"),
            // Debug prints the shortest text that reads back to the same f64.
            Literal::Float(x) => write!(f, "{x:?}"),
            Literal::Str(s) => {
                f.write_str("\"")?;
                for c in s.chars() {
                    match c {
                        '"' => f.write_str("\\\"")?,
                        '\\' => f.write_str("\\\\")?,
                        '\n' => f.write_str("\\n")?,
                        '\t' => f.write_str("\\t")?,
                        c => write!(f, "{c}")?,
                    }
                }
                f.write_str("\"")
            }
            Literal::Bool(b) => write!(f, "{b}"),
            Literal::Null => f.write_str("null"),
        }
    }
}

impl fmt::Display for CmpOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        })
    }
}

/// Prints a predicate in the language [`parse`] reads, with parentheses
/// only where the predicate needs them (an OR inside an AND, an AND or OR
/// inside a NOT, a part of the same kind as the whole): each stands for
/// one the parsed text had, so the printed text nests no deeper than the
/// text it came from and parses back within [`MAX_DEPTH`].
impl fmt::Display for Predicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |f: &mut fmt::Formatter<'_>, parts: &[Predicate], word: &str| {
            for (i, p) in parts.iter().enumerate() {
                if i > 0 {
                    write!(f, " {word} ")?;
                }
                // AND binds tighter than OR; a part of the whole's own kind
                // was parenthesized (else it would have been flattened).
                let grouped = matches!(
                    (self, p),
                    (Predicate::And(_), Predicate::And(_) | Predicate::Or(_))
                        | (Predicate::Or(_), Predicate::Or(_))
                );
                if grouped {
                    write!(f, "({p})")?;
                } else {
                    write!(f, "{p}")?;
                }
            }
            Ok(())
        };
        match self {
            Predicate::Cmp { path, op, value } => write!(f, "{path} {op} {value}"),
            Predicate::Between { path, low, high } => {
                write!(f, "{path} BETWEEN {low} AND {high}")
            }
            Predicate::In { path, values } => {
                write!(f, "{path} IN (")?;
                for (i, v) in values.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str(")")
            }
            Predicate::Prefix { path, prefix } => {
                write!(f, "{path} PREFIX {}", Literal::Str(prefix.clone()))
            }
            Predicate::Contains { path, text } => {
                write!(f, "{path} CONTAINS {}", Literal::Str(text.clone()))
            }
            Predicate::Exists(path) => write!(f, "EXISTS {path}"),
            Predicate::And(parts) => join(f, parts, "AND"),
            Predicate::Or(parts) => join(f, parts, "OR"),
            Predicate::Not(p) => match **p {
                Predicate::And(_) | Predicate::Or(_) => write!(f, "NOT ({p})"),
                _ => write!(f, "NOT {p}"),
            },
        }
    }
}
