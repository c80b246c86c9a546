//! Redis's glob patterns (KEYS, SCAN MATCH, HSCAN MATCH): `*`, `?`,
//! `[abc]`, `[^a]`, `[a-z]`, and `\` to quote; matched byte by byte as
//! Redis's stringmatchlen does.

/// Whether `text` matches `pattern`.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    // The iterative form with one backtrack point for the last `*`: linear
    // in practice and no recursion depth to limit.
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    while p < pattern.len() && pattern[p] == b'*' {
                        p += 1;
                    }
                    if p == pattern.len() {
                        return true;
                    }
                    star = Some((p, t));
                    continue;
                }
                _ => {
                    if let Some(next) = match_one(pattern, p, text[t]) {
                        p = next;
                        t += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    while p < pattern.len() && pattern[p] == b'*' {
        p += 1;
    }
    p == pattern.len()
}

/// Matches one byte at pattern position `p` (not `*`); returns the
/// pattern position after the element on a match.
fn match_one(pattern: &[u8], p: usize, c: u8) -> Option<usize> {
    match pattern[p] {
        b'?' => Some(p + 1),
        b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == c).then_some(p + 2),
        b'[' => match_class(pattern, p + 1, c),
        other => (other == c).then_some(p + 1),
    }
}

/// A `[...]` class starting after its `[`. As in Redis, an unclosed class
/// ends at the pattern's end.
fn match_class(pattern: &[u8], mut p: usize, c: u8) -> Option<usize> {
    let negate = p < pattern.len() && pattern[p] == b'^';
    if negate {
        p += 1;
    }
    let mut matched = false;
    loop {
        if p >= pattern.len() {
            // Redis steps back onto the last byte so the caller's advance
            // lands at the end.
            break;
        }
        match pattern[p] {
            b']' => break,
            b'\\' if p + 1 < pattern.len() => {
                p += 1;
                matched |= pattern[p] == c;
            }
            _ if p + 2 < pattern.len() && pattern[p + 1] == b'-' => {
                let (mut lo, mut hi) = (pattern[p], pattern[p + 2]);
                if lo > hi {
                    std::mem::swap(&mut lo, &mut hi);
                }
                matched |= (lo..=hi).contains(&c);
                p += 2;
            }
            x => matched |= x == c,
        }
        p += 1;
    }
    if negate {
        matched = !matched;
    }
    matched.then_some((p + 1).min(pattern.len()))
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn patterns_match_as_in_redis() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "", true),
            ("*", "abc", true),
            ("a*", "abc", true),
            ("a*c", "abc", true),
            ("a*d", "abc", false),
            ("h?llo", "hello", true),
            ("h?llo", "hllo", false),
            ("h[ae]llo", "hallo", true),
            ("h[ae]llo", "hillo", false),
            ("h[^e]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hbllo", true),
            ("h[b-a]llo", "hbllo", true),
            ("h[a-b]llo", "hcllo", false),
            ("h\\*llo", "h*llo", true),
            ("h\\*llo", "hallo", false),
            ("*b*b*", "abxxbc", true),
            ("user:*:name", "user:42:name", true),
            ("user:*:name", "user:42:mail", false),
        ];
        for (pattern, text, want) in cases {
            assert_eq!(
                glob_match(pattern.as_bytes(), text.as_bytes()),
                *want,
                "{pattern} ~ {text}"
            );
        }
    }
}
