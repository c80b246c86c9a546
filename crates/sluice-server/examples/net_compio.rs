//! Prototype for choosing the server's I/O layer: a thread-per-core
//! PING/ECHO server on compio (one runtime per thread, a SO_REUSEPORT
//! listener each, a task per connection reading into an owned buffer and
//! writing each batch of replies with one write). Measured against
//! examples/net_uring.rs and redis-server by scripts/bench-net.
//!
//! `cargo run --release --example net_compio -- THREADS PORT`

use compio::io::{AsyncRead, AsyncWriteExt};
use compio::net::{TcpListener, TcpStream};
use compio::BufResult;
use sluice_server::resp::{Limits, Protocol, Reply, RequestReader};
use std::net::SocketAddr;

fn listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.set_reuse_port(true)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// PING → +PONG, PING x / ECHO x → x.
fn answer(args: &[Vec<u8>], out: &mut Vec<u8>) {
    let reply = match args {
        [_, x] => Reply::Bulk(x.clone()),
        _ => Reply::Simple("PONG".into()),
    };
    reply.encode_into(Protocol::Resp2, out);
}

async fn serve(mut stream: TcpStream) {
    let mut reader = RequestReader::new(Limits::default());
    let mut buf = Vec::with_capacity(16 << 10);
    let mut out = Vec::with_capacity(16 << 10);
    loop {
        buf.clear();
        let BufResult(n, b) = stream.read(buf).await;
        buf = b;
        if !matches!(n, Ok(n) if n > 0) {
            return;
        }
        reader.feed(&buf);
        out.clear();
        let mut closing = false;
        loop {
            match reader.next(false) {
                Ok(Some(args)) => answer(&args, &mut out),
                Ok(None) => break,
                Err(e) => {
                    out.extend(e.reply());
                    closing = true;
                    break;
                }
            }
        }
        let BufResult(written, o) = stream.write_all(out).await;
        out = o;
        if written.is_err() || closing {
            return;
        }
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let port: u16 = args.next().and_then(|s| s.parse().ok()).unwrap_or(7001);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut handles = Vec::new();
    for _ in 0..threads {
        let l = listener(addr)?;
        handles.push(std::thread::spawn(move || -> std::io::Result<()> {
            let rt = compio::runtime::Runtime::new()?;
            rt.block_on(async move {
                let l = TcpListener::from_std(l)?;
                loop {
                    let (s, _) = l.accept().await?;
                    compio::runtime::spawn(serve(s)).detach();
                }
            })
        }));
    }
    for h in handles {
        h.join().expect("a server thread panicked")?;
    }
    Ok(())
}
