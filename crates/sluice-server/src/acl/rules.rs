//! A user and its selectors: the rules ACL SETUSER takes, how they read
//! back (ACL LIST, GETUSER), and the check of one command against them —
//! each as Redis 7.0 does it (its `acl.c`).

use super::{cat, commands, is_container, is_subcommand, keys_of, lookup, subcommands};
use super::{CommandId, CATEGORY_NAMES};
use crate::resp::Reply;
use std::path::Path;

/// Why a rule was refused, with Redis's words for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetError {
    /// Not a rule, or a pattern with spaces.
    Syntax,
    /// `+name` or `+@category` that does not exist.
    Unknown,
    /// A key pattern after `~*`.
    KeysAfterAll,
    /// A channel pattern after `&*`.
    ChannelsAfterAll,
    /// `<password` or `!hash` the user does not have.
    NoSuchPassword,
    /// `#hash` that is not 64 lower-case hex digits.
    BadHash,
    /// `+container|sub|arg`.
    FirstArgOfSubcommand,
}

impl SetError {
    /// Redis's text for it.
    pub fn text(self) -> &'static str {
        match self {
            SetError::Syntax => "Syntax error",
            SetError::Unknown => "Unknown command or category name in ACL",
            SetError::KeysAfterAll => "Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any effect. Try 'resetkeys' to start with an empty list of patterns",
            SetError::ChannelsAfterAll => "Adding a pattern after the * pattern (or the 'allchannels' flag) is not valid and does not have any effect. Try 'resetchannels' to start with an empty list of channels",
            SetError::NoSuchPassword => "The password you are trying to remove from the user does not exist",
            SetError::BadHash => "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters",
            SetError::FirstArgOfSubcommand => "Allowing first-arg of a subcommand is not supported",
        }
    }
}

/// Why a command was refused; the order is Redis's, which ranks the
/// reasons when no selector allows a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Denied {
    /// The command (or subcommand) is not allowed.
    Command,
    /// A key, at this argument position, is not allowed.
    Key(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct KeyPattern {
    pattern: Vec<u8>,
    read: bool,
    write: bool,
}

impl KeyPattern {
    fn describe(&self) -> String {
        let kind = match (self.read, self.write) {
            (true, true) => "~",
            (true, false) => "%R~",
            _ => "%W~",
        };
        format!("{kind}{}", String::from_utf8_lossy(&self.pattern))
    }
}

/// What one selector allows: commands (a bit each, and first arguments),
/// keys, channels.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Selector {
    /// Set by `+@all` alone: the selector also allows commands added later
    /// (ACL LIST then starts from `+@all`).
    future: bool,
    allowed: Vec<bool>,
    /// `+select|0`: first arguments allowed of a command otherwise denied.
    first_args: Vec<Vec<Vec<u8>>>,
    all_keys: bool,
    patterns: Vec<KeyPattern>,
    all_channels: bool,
    channels: Vec<Vec<u8>>,
}

/// Whether `s` has a space or a NUL (Redis's `ACLStringHasSpaces`).
pub(super) fn has_spaces(s: &[u8]) -> bool {
    s.iter()
        .any(|&c| c == 0 || c.is_ascii_whitespace() || c == 0x0b)
}

impl Selector {
    fn new() -> Self {
        let n = commands().len();
        Selector {
            future: false,
            allowed: vec![false; n],
            first_args: vec![Vec::new(); n],
            all_keys: false,
            patterns: Vec::new(),
            all_channels: false,
            channels: Vec::new(),
        }
    }

    fn change(&mut self, id: CommandId, allow: bool) {
        self.allowed[id] = allow;
        self.first_args[id].clear();
        for sub in subcommands(id) {
            self.allowed[sub] = allow;
        }
    }

    fn change_category(&mut self, bit: u32, allow: bool) {
        for (id, c) in commands().iter().enumerate() {
            if c.categories & bit != 0 {
                self.change(id, allow);
            }
        }
    }

    fn set_all(&mut self, allow: bool) {
        self.future = allow;
        self.allowed.iter_mut().for_each(|b| *b = allow);
        self.first_args.iter_mut().for_each(Vec::clear);
    }

    /// Applies one selector rule.
    fn apply(&mut self, op: &[u8]) -> Result<(), SetError> {
        let is = |word: &str| op.eq_ignore_ascii_case(word.as_bytes());
        if is("allkeys") || is("~*") {
            self.all_keys = true;
            self.patterns.clear();
        } else if is("resetkeys") {
            self.all_keys = false;
            self.patterns.clear();
        } else if is("allchannels") || is("&*") {
            self.all_channels = true;
            self.channels.clear();
        } else if is("resetchannels") {
            self.all_channels = false;
            self.channels.clear();
        } else if is("allcommands") || is("+@all") {
            self.set_all(true);
        } else if is("nocommands") || is("-@all") {
            self.set_all(false);
        } else if op[0] == b'~' || op[0] == b'%' {
            self.add_key_pattern(op)?;
        } else if op[0] == b'&' {
            if self.all_channels {
                return Err(SetError::ChannelsAfterAll);
            }
            let pattern = &op[1..];
            if has_spaces(pattern) {
                return Err(SetError::Syntax);
            }
            if !self.channels.iter().any(|c| c == pattern) {
                self.channels.push(pattern.to_vec());
            }
        } else if (op[0] == b'+' || op[0] == b'-') && op.get(1) == Some(&b'@') {
            let name = &op[2..];
            let bit = CATEGORY_NAMES
                .iter()
                .position(|c| name.eq_ignore_ascii_case(c.as_bytes()))
                .ok_or(SetError::Unknown)?;
            self.change_category(1 << bit, op[0] == b'+');
        } else if op[0] == b'+' {
            self.allow_command(&op[1..])?;
        } else if op[0] == b'-' {
            let id = lookup(&op[1..]).ok_or(SetError::Unknown)?;
            // `future` stays: `+@all -get` still allows commands added later.
            self.change(id, false);
        } else {
            return Err(SetError::Syntax);
        }
        Ok(())
    }

    fn add_key_pattern(&mut self, op: &[u8]) -> Result<(), SetError> {
        if self.all_keys {
            return Err(SetError::KeysAfterAll);
        }
        let (mut read, mut write) = (false, false);
        let mut offset = 1;
        if op[0] == b'%' {
            loop {
                match op.get(offset).map(u8::to_ascii_uppercase) {
                    Some(b'R') if !read => read = true,
                    Some(b'W') if !write => write = true,
                    Some(b'~') => {
                        offset += 1;
                        break;
                    }
                    Some(_) => return Err(SetError::Syntax),
                    // Redis's loop ends at the rule's end as well.
                    None => break,
                }
                offset += 1;
            }
            if !read && !write {
                // `%~x`, `%`: a pattern that allows nothing (Redis refuses it).
                return Err(SetError::Syntax);
            }
        } else {
            (read, write) = (true, true);
        }
        let pattern = &op[offset.min(op.len())..];
        if has_spaces(pattern) {
            return Err(SetError::Syntax);
        }
        match self.patterns.iter_mut().find(|p| p.pattern == pattern) {
            Some(p) => {
                p.read |= read;
                p.write |= write;
            }
            None => self.patterns.push(KeyPattern {
                pattern: pattern.to_vec(),
                read,
                write,
            }),
        }
        self.all_keys = false;
        Ok(())
    }

    /// `+name`, `+container|sub`, `+command|first-arg`.
    fn allow_command(&mut self, spec: &[u8]) -> Result<(), SetError> {
        let Some(bar) = spec.iter().rposition(|&c| c == b'|') else {
            let id = lookup(spec).ok_or(SetError::Unknown)?;
            self.change(id, true);
            return Ok(());
        };
        let (name, arg) = (&spec[..bar], &spec[bar + 1..]);
        let id = lookup(name).ok_or(SetError::Unknown)?;
        if is_subcommand(id) {
            return Err(SetError::FirstArgOfSubcommand);
        }
        if arg.is_empty() {
            return Err(SetError::Syntax);
        }
        if is_container(id) {
            let sub = lookup(spec).ok_or(SetError::Unknown)?;
            self.change(sub, true);
        } else if !self.allowed[id]
            && !self.first_args[id]
                .iter()
                .any(|a| a.eq_ignore_ascii_case(arg))
        {
            // (A first argument of a command allowed whole changes nothing:
            // it is not kept, as ACL LIST would not show it.)
            log::warn!(
                "ACL: allowing a first argument of an otherwise blocked command is a misuse of ACL (+{})",
                String::from_utf8_lossy(spec)
            );
            self.first_args[id].push(arg.to_vec());
        }
        Ok(())
    }

    /// Whether this selector lets `args` (command `id`) run.
    fn check(&self, id: CommandId, args: &[Vec<u8>]) -> Result<(), Denied> {
        let command = &commands()[id];
        if !command.no_auth && !self.allowed[id] {
            let at = if is_subcommand(id) { 2 } else { 1 };
            let allowed_arg = args.get(at).is_some_and(|first| {
                self.first_args[id]
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case(first))
            });
            if !allowed_arg {
                return Err(Denied::Command);
            }
        }
        if !self.all_keys {
            for (at, read, write) in keys_of(id, args) {
                if !self.allows_key(&args[at], read, write) {
                    return Err(Denied::Key(at));
                }
            }
        }
        Ok(())
    }

    fn allows_key(&self, key: &[u8], read: bool, write: bool) -> bool {
        self.all_keys
            || self.patterns.iter().any(|p| {
                (p.read || !read)
                    && (p.write || !write)
                    && crate::commands::glob_match(&p.pattern, key)
            })
    }

    /// Whether this selector allows command `id` on `key` alone, by the
    /// command's bit (not by a first argument).
    fn allows_one_key(&self, id: CommandId, key: &[u8], read: bool, write: bool) -> bool {
        self.allowed[id] && self.allows_key(key, read, write)
    }

    /// Whether this selector allows every command on every key.
    fn unrestricted(&self) -> bool {
        self.all_keys && self.allowed.iter().all(|&b| b)
    }

    fn keys_text(&self) -> String {
        if self.all_keys {
            return "~*".into();
        }
        let patterns: Vec<String> = self.patterns.iter().map(KeyPattern::describe).collect();
        patterns.join(" ")
    }

    fn channels_text(&self) -> String {
        if self.all_channels {
            return "&*".into();
        }
        let channels: Vec<String> = self
            .channels
            .iter()
            .map(|c| format!("&{}", String::from_utf8_lossy(c)))
            .collect();
        channels.join(" ")
    }

    /// The selector as rules: keys, channels, commands.
    fn describe(&self) -> String {
        let mut out = String::new();
        if self.all_keys {
            out.push_str("~* ");
        } else {
            for p in &self.patterns {
                out.push_str(&p.describe());
                out.push(' ');
            }
        }
        if self.all_channels {
            out.push_str("&* ");
        } else {
            out.push_str("resetchannels ");
            for c in &self.channels {
                out.push('&');
                out.push_str(&String::from_utf8_lossy(c));
                out.push(' ');
            }
        }
        out.push_str(&self.describe_commands());
        out
    }

    /// The command rules that rebuild this selector's bits: `+@all` or
    /// `-@all`, then the categories that fit best, then single commands
    /// (Redis's `ACLDescribeSelectorCommandRules`; single commands in the
    /// table's order, where Redis's own order changes from run to run).
    fn describe_commands(&self) -> String {
        let additive = !self.future;
        let mut rules = vec![if additive { "-@all" } else { "+@all" }.to_string()];
        let mut fake = Selector::new();
        fake.set_all(!additive);
        let mut temp = self.allowed.clone();
        let mut applied = [false; 32];
        loop {
            let mut best = None;
            let (mut min_diff, mut max_same) = (usize::MAX, 0);
            for (j, _) in CATEGORY_NAMES.iter().enumerate() {
                if applied[j] {
                    continue;
                }
                let (mut on, mut off) = (0, 0);
                for (id, c) in commands().iter().enumerate() {
                    if c.categories & (1 << j) != 0 {
                        if temp[id] {
                            on += 1;
                        } else {
                            off += 1;
                        }
                    }
                }
                let (diff, same) = if additive { (off, on) } else { (on, off) };
                if same > diff && (diff < min_diff || (diff == min_diff && same > max_same)) {
                    best = Some(j);
                    min_diff = diff;
                    max_same = same;
                }
            }
            let Some(j) = best else { break };
            fake.change_category(1 << j, additive);
            for (id, c) in commands().iter().enumerate() {
                if c.categories & (1 << j) != 0 {
                    temp[id] = !additive;
                    for sub in subcommands(id) {
                        temp[sub] = !additive;
                    }
                }
            }
            rules.push(format!(
                "{}@{}",
                if additive { "+" } else { "-" },
                CATEGORY_NAMES[j]
            ));
            applied[j] = true;
        }
        for (id, c) in commands().iter().enumerate() {
            let mine = self.allowed[id];
            if mine != fake.allowed[id] {
                rules.push(format!("{}{}", if mine { "+" } else { "-" }, c.name));
                fake.change(id, mine);
            }
            if !mine {
                for arg in &self.first_args[id] {
                    rules.push(format!("+{}|{}", c.name, String::from_utf8_lossy(arg)));
                }
            }
        }
        debug_assert_eq!(fake.allowed, self.allowed, "the rules rebuild the bits");
        rules.join(" ")
    }

    /// GETUSER's map of a selector: commands, keys, channels.
    fn fields(&self) -> Vec<(Reply, Reply)> {
        vec![
            (bulk("commands"), bulk(&self.describe_commands())),
            (bulk("keys"), bulk(&self.keys_text())),
            (bulk("channels"), bulk(&self.channels_text())),
        ]
    }
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

/// A user: whether it may log in, its passwords (SHA-256, hex), and its
/// selectors (the first is the root; a command runs if any allows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    name: Vec<u8>,
    enabled: bool,
    nopass: bool,
    /// `sanitize-payload` / `skip-sanitize-payload`, when given (kept and
    /// listed; Sluice checks every payload it restores).
    sanitize: Option<bool>,
    passwords: Vec<String>,
    selectors: Vec<Selector>,
}

fn password_hash(password: &[u8]) -> String {
    sluice_auth::password_sha256_hex(password)
}

fn valid_hash(hash: &[u8]) -> bool {
    hash.len() == 64 && hash.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

impl User {
    /// A new user as ACL SETUSER makes one: off, no password, nothing
    /// allowed.
    pub fn new(name: &[u8]) -> Self {
        User {
            name: name.to_vec(),
            enabled: false,
            nopass: false,
            sanitize: None,
            passwords: Vec::new(),
            selectors: vec![Selector::new()],
        }
    }

    /// The default user as a server starts with it: on, no password, every
    /// command, every key and channel.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant in its message"
    )]
    pub fn default_user() -> Self {
        let mut user = User::new(b"default");
        user.apply(&[
            b"+@all".to_vec(),
            b"~*".to_vec(),
            b"&*".to_vec(),
            b"on".to_vec(),
            b"nopass".to_vec(),
        ])
        .expect("the default user's rules are valid");
        user
    }

    /// A user that may run everything, with this password (a `--users-file`
    /// `NAME:PASSWORD` line).
    pub fn with_password(name: &[u8], password: &[u8]) -> Self {
        let mut user = User::default_user();
        user.name = name.to_vec();
        user.nopass = false;
        user.passwords = vec![password_hash(password)];
        user
    }

    /// The user's name.
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Whether it logs in with any password (or none).
    pub fn nopass(&self) -> bool {
        self.nopass
    }

    /// Whether it may log in.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether `password` logs this user in: on, and nopass or one of its
    /// passwords (every one compared, in constant time).
    pub fn admits(&self, password: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        if self.nopass {
            return true;
        }
        let hash = password_hash(password);
        sluice_auth::any_equal_constant_time(
            self.passwords.iter().map(String::as_bytes),
            hash.as_bytes(),
        )
    }

    /// Whether the user may run every command on every key (connections
    /// then skip the per-command check).
    pub fn unrestricted(&self) -> bool {
        self.selectors[0].unrestricted()
    }

    /// Applies ACL SETUSER's rules, all of them or none; the error is
    /// Redis's reply text (without `ERR`).
    pub fn apply(&mut self, ops: &[Vec<u8>]) -> Result<(), String> {
        let merged = merge_selectors(ops)?;
        let mut staged = self.clone();
        for op in &merged {
            staged.apply_one(op).map_err(|e| {
                format!(
                    "Error in ACL SETUSER modifier '{}': {}",
                    String::from_utf8_lossy(op),
                    e.text()
                )
            })?;
        }
        *self = staged;
        Ok(())
    }

    fn apply_one(&mut self, op: &[u8]) -> Result<(), SetError> {
        if op.is_empty() {
            return Ok(());
        }
        let is = |word: &str| op.eq_ignore_ascii_case(word.as_bytes());
        if is("on") {
            self.enabled = true;
        } else if is("off") {
            self.enabled = false;
        } else if is("skip-sanitize-payload") {
            self.sanitize = Some(false);
        } else if is("sanitize-payload") {
            self.sanitize = Some(true);
        } else if is("nopass") {
            self.nopass = true;
            self.passwords.clear();
        } else if is("resetpass") {
            self.nopass = false;
            self.passwords.clear();
        } else if op[0] == b'>' || op[0] == b'#' {
            let hash = if op[0] == b'>' {
                password_hash(&op[1..])
            } else if valid_hash(&op[1..]) {
                String::from_utf8_lossy(&op[1..]).into_owned()
            } else {
                return Err(SetError::BadHash);
            };
            if !self.passwords.contains(&hash) {
                self.passwords.push(hash);
            }
            self.nopass = false;
        } else if op[0] == b'<' || op[0] == b'!' {
            let hash = if op[0] == b'<' {
                password_hash(&op[1..])
            } else if valid_hash(&op[1..]) {
                String::from_utf8_lossy(&op[1..]).into_owned()
            } else {
                return Err(SetError::BadHash);
            };
            let at = self
                .passwords
                .iter()
                .position(|p| *p == hash)
                .ok_or(SetError::NoSuchPassword)?;
            self.passwords.remove(at);
        } else if op[0] == b'(' && op[op.len() - 1] == b')' {
            let mut selector = Selector::new();
            let inner = &op[1..op.len() - 1];
            for rule in inner
                .split(|c| c.is_ascii_whitespace())
                .filter(|r| !r.is_empty())
            {
                // A parenthesis inside a selector (`(~a) +get)`) would read
                // back as another selector: ACL SAVE would write a file ACL
                // LOAD refuses. Redis takes it; Sluice refuses it.
                if rule.contains(&b'(') || rule.contains(&b')') {
                    return Err(SetError::Syntax);
                }
                selector.apply(rule)?;
            }
            self.selectors.push(selector);
        } else if is("clearselectors") {
            self.selectors.truncate(1);
        } else if is("reset") {
            for rule in [
                "resetpass",
                "resetkeys",
                "resetchannels",
                "off",
                "sanitize-payload",
                "clearselectors",
                "-@all",
            ] {
                self.apply_one(rule.as_bytes())?;
            }
        } else {
            self.selectors[0].apply(op)?;
        }
        Ok(())
    }

    /// The user as rules (ACL LIST's line after `user NAME `).
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for flag in self.flags() {
            out.push_str(flag);
            out.push(' ');
        }
        for p in &self.passwords {
            out.push('#');
            out.push_str(p);
            out.push(' ');
        }
        out.push_str(&self.selectors[0].describe());
        for s in &self.selectors[1..] {
            out.push_str(" (");
            out.push_str(&s.describe());
            out.push(')');
        }
        out
    }

    fn flags(&self) -> Vec<&'static str> {
        let mut flags = vec![if self.enabled { "on" } else { "off" }];
        if self.nopass {
            flags.push("nopass");
        }
        match self.sanitize {
            Some(false) => flags.push("skip-sanitize-payload"),
            Some(true) => flags.push("sanitize-payload"),
            None => {}
        }
        flags
    }

    /// ACL GETUSER's reply.
    pub fn getuser(&self) -> Reply {
        let mut fields = vec![
            (
                bulk("flags"),
                Reply::Set(self.flags().into_iter().map(bulk).collect()),
            ),
            (
                bulk("passwords"),
                Reply::Array(self.passwords.iter().map(|p| bulk(p)).collect()),
            ),
        ];
        fields.extend(self.selectors[0].fields());
        fields.push((
            bulk("selectors"),
            Reply::Array(
                self.selectors[1..]
                    .iter()
                    .map(|s| Reply::Map(s.fields()))
                    .collect(),
            ),
        ));
        Reply::Map(fields)
    }

    /// Whether a selector lets the user run command `id` on every key (SORT
    /// reads keys its BY and GET patterns name only then, as Redis's
    /// ACLUserCheckCmdWithUnrestrictedKeyAccess asks).
    pub fn allows_every_key(&self, id: CommandId) -> bool {
        self.selectors.iter().any(|s| s.allowed[id] && s.all_keys)
    }

    /// A quick [`User::check`] of command `id` naming `key` only, read
    /// and/or written: true if a selector allows it by the command's own
    /// bit; false sends the command to the full check.
    pub fn allows_one_key(&self, id: CommandId, key: &[u8], read: bool, write: bool) -> bool {
        self.selectors
            .iter()
            .any(|s| s.allows_one_key(id, key, read, write))
    }

    /// Whether the user may run `args` (command `id`): allowed if any
    /// selector allows it; else the reason Redis would give.
    pub fn check(&self, id: CommandId, args: &[Vec<u8>]) -> Result<(), Denied> {
        let mut worst = Denied::Command;
        for selector in &self.selectors {
            match selector.check(id, args) {
                Ok(()) => return Ok(()),
                Err(denied) => worst = worst.max(denied),
            }
        }
        Err(worst)
    }
}

/// ACL SETUSER's arguments with each selector (`(~x +get)` given as
/// several arguments) joined into one.
#[expect(
    clippy::expect_used,
    reason = "a selector's closing parenthesis is taken only after its opening one"
)]
fn merge_selectors(ops: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, String> {
    let mut merged = Vec::new();
    let mut open: Option<(usize, Vec<u8>)> = None;
    for (j, op) in ops.iter().enumerate() {
        if let Some((_, selector)) = &mut open {
            selector.push(b' ');
            selector.extend_from_slice(op);
            if op.last() == Some(&b')') {
                merged.push(open.take().expect("open").1);
            }
            continue;
        }
        if op.first() == Some(&b'(') && op.last() != Some(&b')') {
            open = Some((j, op.clone()));
            continue;
        }
        merged.push(op.clone());
    }
    if let Some((j, _)) = open {
        return Err(format!(
            "Unmatched parenthesis in acl selector starting at '{}'.",
            String::from_utf8_lossy(&ops[j])
        ));
    }
    Ok(merged)
}

/// Reads an ACL file: `user NAME rules...` lines as Redis writes them,
/// or `NAME:PASSWORD` lines (a user who may run everything). Blank lines
/// and `#` comments are skipped. Every error is listed, with its line.
pub fn load_file(path: &Path) -> Result<Vec<User>, String> {
    let text = sluice_auth::read_secret_file(path, "--users-file").map_err(|e| e.to_string())?;
    parse_file(&text, &path.display().to_string())
}

/// [`load_file`] of `text`; `origin` names it in errors.
pub fn parse_file(text: &str, origin: &str) -> Result<Vec<User>, String> {
    let mut users: Vec<User> = Vec::new();
    let mut errors = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_matches(|c| c == ' ' || c == '\t' || c == '\r');
        let at = n + 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let user = if let Some(rest) = line.strip_prefix("user ") {
            let words: Vec<Vec<u8>> = rest
                .split(' ')
                .filter(|w| !w.is_empty())
                .map(|w| w.as_bytes().to_vec())
                .collect();
            let Some((name, ops)) = words.split_first() else {
                errors.push(format!(
                    "{origin}:{at} should start with user keyword followed by the username."
                ));
                continue;
            };
            let mut user = User::new(name);
            if let Err(e) = user.apply(ops) {
                errors.push(format!("{origin}:{at}: {e}."));
                continue;
            }
            user
        } else if let Some((name, password)) = line.split_once(':') {
            if name.is_empty() || has_spaces(name.as_bytes()) || password.is_empty() {
                errors.push(format!("{origin}:{at}: a NAME:PASSWORD line needs a name without spaces and a password"));
                continue;
            }
            User::with_password(name.as_bytes(), password.as_bytes())
        } else {
            errors.push(format!(
                "{origin}:{at}: neither `user NAME rules...` (an ACL line) nor NAME:PASSWORD"
            ));
            continue;
        };
        if users.iter().any(|u| u.name == user.name) {
            errors.push(format!(
                "{origin}:{at}: duplicate user '{}'",
                String::from_utf8_lossy(&user.name)
            ));
            continue;
        }
        if users.len() >= super::MAX_USERS {
            errors.push(format!("{origin}: more than {} users", super::MAX_USERS));
            break;
        }
        users.push(user);
    }
    if errors.is_empty() {
        Ok(users)
    } else {
        Err(format!(
            "{} No change to the ACL rules was made.",
            errors.join(" ")
        ))
    }
}

/// Writes `text` to `path` as a new file renamed over the old one (so a
/// crash leaves the old or the new, never half), readable by its owner
/// only, synced before the rename.
pub fn save_file(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let fail = |what: &str, e: std::io::Error| {
        log::warn!("ACL SAVE: {what} {}: {e}", tmp.display());
        let _ = std::fs::remove_file(&tmp);
        format!(
            "There was an error trying to save the ACLs: {what} {}: {e}",
            tmp.display()
        )
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| fail("creating", e))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| fail("writing", e))?;
    std::fs::rename(&tmp, path).map_err(|e| fail("renaming", e))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Every category's bit, for tests and ACL CAT.
pub fn category_bit(name: &[u8]) -> Option<u32> {
    CATEGORY_NAMES
        .iter()
        .position(|c| name.eq_ignore_ascii_case(c.as_bytes()))
        .map(|j| 1 << j)
}

const _: () = assert!(cat::SCRIPTING == 1 << 20);
