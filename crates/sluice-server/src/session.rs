//! A connection's own state and the commands about it — PING, ECHO,
//! HELLO, AUTH, SELECT, QUIT, RESET, CLIENT ID/SETNAME/GETNAME — answered
//! as Redis 7 answers them: the same checks in the same order (unknown
//! command, arity, authentication), the same texts, the same HELLO map.
//! Checked against a real `redis-server` in tests/session_redis.rs.

use crate::acl::User;
use crate::resp::{Args, Protocol, Reply};
use std::sync::Arc;

/// What HELLO reports as the server and its version. Clients pick features
/// by them, and Sluice answers as the Redis version whose behaviour it
/// matches.
pub const SERVER_NAME: &str = "redis";
/// See [`SERVER_NAME`].
pub const SERVER_VERSION: &str = "7.0.15";

/// Who may connect and what each may do: Redis's ACL users.
pub use crate::acl::Users;

/// The connection commands a session answers, with Redis's arities.
pub const COMMANDS: &[(&str, i32)] = &[
    ("ping", -1),
    ("echo", 2),
    ("select", 2),
    ("quit", -1),
    ("reset", 1),
    ("auth", -2),
    ("hello", -1),
    ("client", -2),
];

/// What the connection does after a command.
#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// Send the reply and read on.
    Reply(Reply),
    /// Send the reply, then close the connection (QUIT).
    Close(Reply),
    /// Not a connection command: the caller's dispatcher takes it (after
    /// [`Session::check_auth`]).
    Other,
}

/// One connection's state.
#[derive(Debug, Clone)]
pub struct Session {
    id: u64,
    protocol: Protocol,
    authenticated: bool,
    name: Option<Vec<u8>>,
    /// The user it runs as (the default user until AUTH), as of
    /// `generation` of the users.
    user: Arc<User>,
    generation: u64,
    /// The user may run everything on every key: no check per command.
    unrestricted: bool,
    /// The user name of the last refused login, for ACL LOG (the caller
    /// knows the client to log it with).
    refused_login: Option<Vec<u8>>,
    /// The logical database SELECT chose (0 to 15).
    db: u8,
}

/// What [`Session::refresh`] found of the session's user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refreshed {
    /// As it was, or changed: the session follows it.
    Current,
    /// Removed (ACL DELUSER, ACL LOAD): the connection is to close, as
    /// Redis closes the clients of a removed user.
    Removed,
}

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
const NOAUTH: &str = "NOAUTH Authentication required.";

fn error(text: impl Into<String>) -> Reply {
    Reply::Error(text.into())
}

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

fn wrong_arity(name: &str) -> Reply {
    error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// The bytes of a C string, as Redis's `%s` prints them: up to a NUL, at
/// most `max`.
fn c_str(b: &[u8], max: usize) -> &[u8] {
    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    &b[..end.min(max)]
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Redis 7's reply to a command it does not know (`args` not empty).
pub fn unknown_command(args: &Args) -> Reply {
    let mut listed: Vec<u8> = Vec::new();
    for a in &args[1..] {
        if listed.len() >= 128 {
            break;
        }
        let room = 128 - listed.len();
        listed.push(b'\'');
        listed.extend_from_slice(c_str(a, room));
        listed.extend_from_slice(b"' ");
    }
    let mut text = b"ERR unknown command '".to_vec();
    text.extend_from_slice(c_str(&args[0], 128));
    text.extend_from_slice(b"', with args beginning with: ");
    text.extend_from_slice(&listed);
    error(lossy(&text))
}

/// Redis's check on client names: printable ASCII without spaces.
fn valid_name(name: &[u8]) -> bool {
    name.iter().all(|&c| (b'!'..=b'~').contains(&c))
}

const BAD_NAME: &str = "ERR Client names cannot contain spaces, newlines or special characters.";

impl Session {
    /// A new connection with this id (RESP2, not authenticated unless the
    /// default user needs no password).
    pub fn new(id: u64, users: &Users) -> Self {
        let generation = users.generation();
        let user = users.default_user();
        Session {
            id,
            protocol: Protocol::Resp2,
            authenticated: user.nopass() && user.enabled(),
            name: None,
            unrestricted: user.unrestricted(),
            user,
            generation,
            refused_login: None,
            db: 0,
        }
    }

    /// The logical database the connection has selected.
    pub fn db(&self) -> u8 {
        self.db
    }

    /// Selects logical database `db` (the caller checked it, 0 to 15).
    pub fn set_db(&mut self, db: u8) {
        debug_assert!(usize::from(db) < sluice_redis::DATABASES);
        self.db = db;
    }

    /// The user the connection runs as.
    pub fn user(&self) -> &Arc<User> {
        &self.user
    }

    /// Whether the connection may run any command on any key without a
    /// check: authenticated as a user who may, and no user changed since.
    pub fn unrestricted(&self, users: &Users) -> bool {
        self.unrestricted && self.authenticated && self.generation == users.generation()
    }

    /// Whether the connection may run GET (`write` false) or a plain SET
    /// (`write` true) of `key` on a path that frames it in place: a quick
    /// check for a restricted user; false sends it to the general path.
    pub fn allows_plain(&self, users: &Users, write: bool, key: &[u8]) -> bool {
        if self.unrestricted(users) {
            return true;
        }
        if !self.authenticated || !self.current(users) {
            return false;
        }
        let id = if write {
            *crate::acl::SET_ID
        } else {
            *crate::acl::GET_ID
        };
        self.user.allows_one_key(id, key, !write, write)
    }

    /// Whether no user changed since the session last looked.
    pub fn current(&self, users: &Users) -> bool {
        self.generation == users.generation()
    }

    /// Follows changes of the users since the session last looked.
    pub fn refresh(&mut self, users: &Users) -> Refreshed {
        let generation = users.generation();
        if generation == self.generation {
            return Refreshed::Current;
        }
        match users.get(self.user.name()) {
            Some(user) if user.name() == b"default" || self.authenticated => {
                self.generation = generation;
                self.unrestricted = user.unrestricted();
                self.user = user;
                Refreshed::Current
            }
            _ => Refreshed::Removed,
        }
    }

    /// The user name of a login refused since the last call.
    pub fn take_refused_login(&mut self) -> Option<Vec<u8>> {
        self.refused_login.take()
    }

    fn login(&mut self, users: &Users, user: &[u8], password: &[u8]) -> bool {
        match users.authenticate(user, password) {
            Some(found) => {
                self.authenticated = true;
                self.generation = users.generation();
                self.unrestricted = found.unrestricted();
                self.user = found;
                true
            }
            None => {
                self.refused_login = Some(user.to_vec());
                false
            }
        }
    }

    /// The connection's id (CLIENT ID).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The protocol replies go out in.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Whether the client still has to authenticate (the request reader
    /// then applies its tighter limits).
    pub fn unauthenticated(&self) -> bool {
        !self.authenticated
    }

    /// The name CLIENT SETNAME or HELLO SETNAME gave.
    pub fn name(&self) -> Option<&[u8]> {
        self.name.as_deref()
    }

    /// The NOAUTH error, for a command the caller's dispatcher takes, when
    /// the client has not authenticated.
    pub fn check_auth(&self) -> Option<Reply> {
        (!self.authenticated).then(|| error(NOAUTH))
    }

    /// Answers a connection command; anything else is [`Handled::Other`].
    pub fn handle(&mut self, args: &Args, users: &Users) -> Handled {
        let name = args[0].to_ascii_lowercase();
        let argc = args.len();
        let reply = match &name[..] {
            b"ping" => self.check_auth().unwrap_or_else(|| match argc {
                1 => Reply::Simple("PONG".into()),
                2 => Reply::Bulk(args[1].clone()),
                _ => wrong_arity("ping"),
            }),
            b"echo" if argc != 2 => wrong_arity("echo"),
            b"echo" => self
                .check_auth()
                .unwrap_or_else(|| Reply::Bulk(args[1].clone())),
            b"select" if argc != 2 => wrong_arity("select"),
            b"select" => self.check_auth().unwrap_or_else(|| match select(&args[1]) {
                Ok(db) => {
                    self.db = db;
                    ok()
                }
                Err(refused) => refused,
            }),
            b"quit" => return Handled::Close(ok()),
            b"reset" if argc != 1 => wrong_arity("reset"),
            b"reset" => {
                *self = Session::new(self.id, users);
                Reply::Simple("RESET".into())
            }
            b"auth" if argc < 2 => wrong_arity("auth"),
            b"auth" => self.auth(args, users),
            b"hello" => self.hello(args, users),
            b"client" => self.client(args),
            _ => return Handled::Other,
        };
        Handled::Reply(reply)
    }

    fn auth(&mut self, args: &Args, users: &Users) -> Reply {
        let (user, password): (&[u8], &[u8]) = match &args[1..] {
            [password] => {
                if users.default_user().nopass() {
                    return error(
                        "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
                    );
                }
                (b"default", password)
            }
            [user, password] => (user, password),
            _ => return error("ERR syntax error"),
        };
        if self.login(users, user, password) {
            ok()
        } else {
            error(WRONGPASS)
        }
    }

    fn hello(&mut self, args: &Args, users: &Users) -> Reply {
        let mut version = None;
        if let Some(v) = args.get(1) {
            match crate::resp::string_to_i64(v) {
                Some(2) => version = Some(Protocol::Resp2),
                Some(3) => version = Some(Protocol::Resp3),
                Some(_) => return error("NOPROTO unsupported protocol version"),
                None => return error("ERR Protocol version is not an integer or out of range"),
            }
        }
        // Each option takes effect as it is read, as in Redis: an error in
        // a later one leaves the name set or the user logged in.
        let mut j = 2;
        while j < args.len() {
            let more = args.len() - 1 - j;
            let option = args[j].to_ascii_lowercase();
            if option == b"auth" && more >= 2 {
                if !self.login(users, &args[j + 1], &args[j + 2]) {
                    return error(WRONGPASS);
                }
                j += 3;
            } else if option == b"setname" && more >= 1 {
                if !valid_name(&args[j + 1]) {
                    return error(BAD_NAME);
                }
                let n = &args[j + 1];
                self.name = (!n.is_empty()).then(|| n.clone());
                j += 2;
            } else {
                return error(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    lossy(c_str(&args[j], usize::MAX))
                ));
            }
        }
        if !self.authenticated {
            return error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
            );
        }
        if let Some(v) = version {
            self.protocol = v;
        }
        let field = |k: &str| Reply::Bulk(k.as_bytes().to_vec());
        Reply::Map(vec![
            (field("server"), field(SERVER_NAME)),
            (field("version"), field(SERVER_VERSION)),
            (
                field("proto"),
                Reply::Integer(if self.protocol == Protocol::Resp3 {
                    3
                } else {
                    2
                }),
            ),
            (field("id"), Reply::Integer(self.id as i64)),
            (field("mode"), field("standalone")),
            (field("role"), field("master")),
            (field("modules"), Reply::Array(Vec::new())),
        ])
    }

    fn client(&mut self, args: &Args) -> Reply {
        let Some(sub) = args.get(1) else {
            return wrong_arity("client");
        };
        let sub_name = sub.to_ascii_lowercase();
        let arity = match &sub_name[..] {
            b"id" | b"getname" => 2,
            b"setname" => 3,
            _ => {
                return error(format!(
                    "ERR unknown subcommand '{}'. Try {} HELP.",
                    lossy(c_str(sub, 128)),
                    lossy(&args[0]).to_ascii_uppercase()
                ))
            }
        };
        if args.len() != arity {
            return wrong_arity(&format!("client|{}", lossy(&sub_name)));
        }
        if let Some(noauth) = self.check_auth() {
            return noauth;
        }
        match &sub_name[..] {
            b"id" => Reply::Integer(self.id as i64),
            b"getname" => match &self.name {
                Some(n) => Reply::Bulk(n.clone()),
                None => Reply::Null,
            },
            _ => {
                let name = &args[2];
                if !valid_name(name) {
                    return error(BAD_NAME);
                }
                self.name = (!name.is_empty()).then(|| name.clone());
                ok()
            }
        }
    }
}

/// SELECT's database: 0 to 15, else Redis's refusal.
pub fn select(index: &[u8]) -> Result<u8, Reply> {
    database_number(index, None).map_err(error)
}

/// A database number, 0 to 15, else Redis's refusal (ERR and its words):
/// `refusal` replaces the words for an argument that is no integer or
/// outside 32 bits (SWAPDB's "invalid first DB index").
pub fn database_number(arg: &[u8], refusal: Option<&str>) -> Result<u8, String> {
    let refused = |default: &str| format!("ERR {}", refusal.unwrap_or(default));
    let n = crate::resp::string_to_i64(arg)
        .ok_or_else(|| refused("value is not an integer or out of range"))?;
    if i32::try_from(n).is_err() {
        // Redis's own wording.
        return Err(refused(
            "value is out of range, value must between -2147483648 and 2147483647",
        ));
    }
    u8::try_from(n)
        .ok()
        .filter(|&db| usize::from(db) < sluice_redis::DATABASES)
        .ok_or_else(|| "ERR DB index is out of range".to_string())
}
