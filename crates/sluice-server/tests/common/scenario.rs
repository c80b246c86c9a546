//! Scenarios of several clients against a real `redis-server` and a
//! Sluice server: every reply each client reads must be the same bytes,
//! in the same order (blocking commands, pub/sub).

use super::{request, small_store, start_redis, start_sluice_on, Client};
use sluice_server::server::{Durability, ServerConfig};
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

pub use Step::*;

/// One step of a scenario, by client number.
pub enum Step {
    /// Send and read the reply.
    Call(usize, &'static str),
    /// Send and read the reply without comparing it (HELLO: the client
    /// ids are each server's own).
    Quiet(usize, &'static str),
    /// Send without reading (a command that blocks).
    Send(usize, &'static str),
    /// Read the reply the client's earlier `Send` gets.
    Read(usize),
    /// Send the commands in one write (a pipeline) and read a reply each.
    Pipeline(usize, &'static [&'static str]),
    /// Let the servers work (a timeout to pass, a wake to land).
    Sleep(u64),
    /// Close the client's connection and open a new one.
    Reconnect(usize),
    /// Client .0 sends `CLIENT UNBLOCK <client .1's id> .2` (ids are each
    /// server's own) and reads the reply.
    Unblock(usize, usize, &'static str),
    /// Client .0 sends .2 with `{id}` replaced by client .1's id, and reads
    /// the reply (CLIENT TRACKING ... REDIRECT {id}).
    WithId(usize, usize, &'static str),
}

pub fn args(line: &str) -> Vec<Vec<u8>> {
    sluice_server::resp::split_args(line.as_bytes()).unwrap()
}

/// Runs `steps` with `clients` connections to `addr`; the replies read,
/// labelled with their step.
fn run(addr: SocketAddr, clients: usize, steps: &[Step]) -> Vec<String> {
    let mut c: Vec<Client> = (0..clients).map(|_| Client::connect(addr)).collect();
    let id_of = |c: &mut Client| -> String {
        let reply = String::from_utf8(c.call(&[b"CLIENT", b"ID"])).unwrap();
        reply.trim_start_matches(':').trim_end().to_string()
    };
    let mut ids: Vec<String> = c.iter_mut().map(id_of).collect();
    c[0].call(&[b"FLUSHALL"]);
    let mut out = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        if std::env::var_os("BLOCKING_TRACE").is_some() {
            eprintln!("{addr} step {i}");
        }
        match step {
            Call(n, line) => {
                c[*n].stream.write_all(&request(&args(line))).unwrap();
                let reply = c[*n].read_reply().unwrap();
                out.push(format!("{i} {line}: {}", String::from_utf8_lossy(&reply)));
            }
            Quiet(n, line) => {
                c[*n].stream.write_all(&request(&args(line))).unwrap();
                c[*n].read_reply().unwrap();
            }
            Send(n, line) => c[*n].stream.write_all(&request(&args(line))).unwrap(),
            Pipeline(n, lines) => {
                let bytes: Vec<u8> = lines.iter().flat_map(|l| request(&args(l))).collect();
                c[*n].stream.write_all(&bytes).unwrap();
                for line in lines.iter() {
                    let reply = c[*n].read_reply().unwrap();
                    out.push(format!("{i} {line}: {}", String::from_utf8_lossy(&reply)));
                }
            }
            Read(n) => {
                let reply = c[*n].read_reply().unwrap();
                out.push(format!(
                    "{i} client {n} read: {}",
                    String::from_utf8_lossy(&reply)
                ));
            }
            Sleep(ms) => std::thread::sleep(Duration::from_millis(*ms)),
            Reconnect(n) => {
                c[*n] = Client::connect(addr);
                ids[*n] = id_of(&mut c[*n]);
            }
            WithId(n, target, template) => {
                let line = template.replace("{id}", &ids[*target]);
                c[*n].stream.write_all(&request(&args(&line))).unwrap();
                let reply = c[*n].read_reply().unwrap();
                out.push(format!(
                    "{i} {template} (client {target}): {}",
                    // The id as an integer reply (or inside one).
                    String::from_utf8_lossy(&reply)
                        .replace(&format!(":{}\r\n", ids[*target]), ":{id}\r\n")
                ));
            }
            Unblock(n, target, mode) => {
                let line = format!("CLIENT UNBLOCK {} {mode}", ids[*target]);
                c[*n].stream.write_all(&request(&args(&line))).unwrap();
                let reply = c[*n].read_reply().unwrap();
                out.push(format!(
                    "{i} CLIENT UNBLOCK client {target} {mode}: {}",
                    String::from_utf8_lossy(&reply)
                ));
            }
        }
    }
    out
}

pub fn compare(clients: usize, steps: &[Step]) {
    let redis = start_redis(&[]);
    let sluice = start_sluice_on(
        small_store(),
        ServerConfig {
            threads: 2,
            durability: Durability::Always,
            ..ServerConfig::default()
        },
    );
    let want = run(
        SocketAddr::from(([127, 0, 0, 1], redis.port)),
        clients,
        steps,
    );
    let got = run(sluice.addr, clients, steps);
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(g, w, "\nredis:  {want:#?}\nsluice: {got:#?}");
    }
    assert_eq!(got.len(), want.len());
}
