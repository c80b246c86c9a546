//! `struct`: binary packing as Lua's struct library does it.

use super::{format_g, lib_fn, type_name, BytesOut};
use mlua::{Lua, LuaString, MultiValue, Table, Value};

/// Widest integer `i`n / `I`n packs.
const STRUCT_MAX_INT_BYTES: usize = 32;
/// Alignment `!` sets without a number (a double's, on 64-bit Linux).
const STRUCT_MAX_ALIGN: usize = 8;

/// A format's running state: byte order and alignment.
struct Layout {
    little: bool,
    align: usize,
}

/// Reads a decimal count at `at` in `fmt`; `default` if there is none.
fn struct_count(fmt: &[u8], at: &mut usize, default: usize) -> Result<usize, String> {
    if !fmt.get(*at).is_some_and(u8::is_ascii_digit) {
        return Ok(default);
    }
    let mut n: usize = 0;
    while let Some(d) = fmt.get(*at).filter(|b| b.is_ascii_digit()) {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(usize::from(d - b'0')))
            .filter(|&n| n <= i32::MAX as usize)
            .ok_or("integral size overflow")?;
        *at += 1;
    }
    Ok(n)
}

/// The size option `opt` takes (reading its count from `fmt`).
fn struct_size(opt: u8, fmt: &[u8], at: &mut usize) -> Result<usize, String> {
    Ok(match opt {
        b'b' | b'B' | b'x' => 1,
        b'h' | b'H' => 2,
        b'l' | b'L' | b'T' | b'd' => 8,
        b'f' => 4,
        b'c' => struct_count(fmt, at, 1)?,
        b'i' | b'I' => {
            let n = struct_count(fmt, at, 4)?;
            if n > STRUCT_MAX_INT_BYTES {
                return Err(format!(
                    "integral size {n} is larger than limit of {STRUCT_MAX_INT_BYTES}"
                ));
            }
            n
        }
        _ => 0,
    })
}

/// Padding before an item of `size` at offset `len`.
fn struct_padding(len: usize, layout: &Layout, opt: u8, size: usize) -> usize {
    if size == 0 || opt == b'c' {
        return 0;
    }
    let size = size.min(layout.align);
    (size.wrapping_sub(len & (size - 1))) & (size - 1)
}

/// Applies a control option (`>`, `<`, `!`n, space); `function` names the
/// caller in the error for an unknown option.
fn struct_control(
    opt: u8,
    fmt: &[u8],
    at: &mut usize,
    layout: &mut Layout,
    function: &str,
) -> Result<(), String> {
    match opt {
        b' ' => {}
        b'>' => layout.little = false,
        b'<' => layout.little = true,
        b'!' => {
            let a = struct_count(fmt, at, STRUCT_MAX_ALIGN)?;
            if !a.is_power_of_two() {
                return Err(format!("alignment {a} is not a power of 2"));
            }
            layout.align = a;
        }
        _ => {
            return Err(format!(
                "bad argument #1 to '{function}' (invalid format option '{}')",
                opt as char
            ))
        }
    }
    Ok(())
}

fn struct_pack(fmt: &[u8], args: &[Value]) -> Result<Vec<u8>, String> {
    let mut layout = Layout {
        little: true,
        align: 1,
    };
    let (mut out, mut at, mut arg) = (Vec::new(), 0usize, 0usize);
    let number = |arg: usize| -> Result<f64, String> {
        match args.get(arg) {
            Some(Value::Number(n)) => Ok(*n),
            Some(Value::Integer(i)) => Ok(*i as f64),
            Some(Value::String(s)) => s
                .to_str()
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .ok_or_else(|| {
                    format!(
                        "bad argument #{} to 'pack' (number expected, got string)",
                        arg + 2
                    )
                }),
            other => Err(format!(
                "bad argument #{} to 'pack' (number expected, got {})",
                arg + 2,
                other.map_or("no value", type_name)
            )),
        }
    };
    while at < fmt.len() {
        let opt = fmt[at];
        at += 1;
        let mut size = struct_size(opt, fmt, &mut at)?;
        let pad = struct_padding(out.len(), &layout, opt, size);
        out.resize(out.len() + pad, 0);
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let n = number(arg)?;
                arg += 1;
                let value = if n < 0.0 { n as i64 as u64 } else { n as u64 };
                let mut bytes: Vec<u8> = (0..size)
                    .map(|i| if i < 8 { (value >> (8 * i)) as u8 } else { 0 })
                    .collect();
                if !layout.little {
                    bytes.reverse();
                }
                out.extend_from_slice(&bytes);
            }
            b'x' => out.push(0),
            b'f' | b'd' => {
                let n = number(arg)?;
                arg += 1;
                let mut bytes = if opt == b'f' {
                    (n as f32).to_le_bytes().to_vec()
                } else {
                    n.to_le_bytes().to_vec()
                };
                if !layout.little {
                    bytes.reverse();
                }
                out.extend_from_slice(&bytes);
            }
            b'c' | b's' => {
                let text = match args.get(arg) {
                    Some(Value::String(s)) => s.as_bytes().to_vec(),
                    Some(v @ (Value::Number(_) | Value::Integer(_))) => {
                        lua_number_text(v).into_bytes()
                    }
                    other => {
                        return Err(format!(
                            "bad argument #{} to 'pack' (string expected, got {})",
                            arg + 2,
                            other.map_or("no value", type_name)
                        ))
                    }
                };
                arg += 1;
                if size == 0 {
                    size = text.len();
                }
                if text.len() < size {
                    return Err(format!(
                        "bad argument #{} to 'pack' (string too short)",
                        arg + 1
                    ));
                }
                out.extend_from_slice(&text[..size]);
                if opt == b's' {
                    out.push(0);
                }
            }
            _ => struct_control(opt, fmt, &mut at, &mut layout, "pack")?,
        }
    }
    Ok(out)
}

/// A number as a string argument reads it (Lua's `%.14g`).
fn lua_number_text(v: &Value) -> String {
    match v {
        Value::Integer(i) => i.to_string(),
        Value::Number(n) => format_g(*n, 14),
        _ => String::new(),
    }
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 4 bytes; 8 bytes"
)]
fn struct_unpack(lua: &Lua, fmt: &[u8], data: &[u8], start: i64) -> Result<MultiValue, String> {
    if start < 1 {
        return Err("bad argument #3 to 'unpack' (offset must be 1 or greater)".into());
    }
    let mut layout = Layout {
        little: true,
        align: 1,
    };
    let (mut pos, mut at) = (start as usize - 1, 0usize);
    let mut out: Vec<Value> = Vec::new();
    let lua_err = |e: mlua::Error| e.to_string();
    while at < fmt.len() {
        let opt = fmt[at];
        at += 1;
        let mut size = struct_size(opt, fmt, &mut at)?;
        pos += struct_padding(pos, &layout, opt, size);
        let short = || "bad argument #2 to 'unpack' (data string too short)".to_string();
        if size > data.len() || pos > data.len() - size {
            return Err(short());
        }
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let mut bytes = data[pos..pos + size].to_vec();
                if !layout.little {
                    bytes.reverse();
                }
                let mut value: u64 = 0;
                for (i, b) in bytes.iter().enumerate().take(8) {
                    value |= u64::from(*b) << (8 * i);
                }
                let n = if opt.is_ascii_lowercase() && (1..8).contains(&size) {
                    let shift = 64 - 8 * size as u32;
                    ((value << shift) as i64 >> shift) as f64
                } else if opt.is_ascii_lowercase() {
                    value as i64 as f64
                } else {
                    value as f64
                };
                out.push(Value::Number(n));
            }
            b'x' => {}
            b'f' | b'd' => {
                let mut bytes = data[pos..pos + size].to_vec();
                if !layout.little {
                    bytes.reverse();
                }
                let n = if opt == b'f' {
                    f64::from(f32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")))
                } else {
                    f64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
                };
                out.push(Value::Number(n));
            }
            b'c' => {
                if size == 0 {
                    size = match out.pop() {
                        Some(Value::Number(n)) if n >= 0.0 => n as usize,
                        _ => return Err("format 'c0' needs a previous size".into()),
                    };
                    if size > data.len() || pos > data.len() - size {
                        return Err(short());
                    }
                }
                out.push(Value::String(
                    lua.create_string(&data[pos..pos + size]).map_err(lua_err)?,
                ));
            }
            b's' => {
                let end = data[pos..]
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or("unfinished string in data")?;
                size = end + 1;
                out.push(Value::String(
                    lua.create_string(&data[pos..pos + end]).map_err(lua_err)?,
                ));
            }
            _ => struct_control(opt, fmt, &mut at, &mut layout, "unpack")?,
        }
        pos += size;
    }
    out.push(Value::Integer(pos as i64 + 1));
    Ok(MultiValue::from_iter(out))
}

fn struct_fixed_size(fmt: &[u8]) -> Result<usize, String> {
    let mut layout = Layout {
        little: true,
        align: 1,
    };
    let (mut pos, mut at) = (0usize, 0usize);
    while at < fmt.len() {
        let opt = fmt[at];
        at += 1;
        let size = struct_size(opt, fmt, &mut at)?;
        pos += struct_padding(pos, &layout, opt, size);
        if opt == b's' {
            return Err("bad argument #1 to 'size' (option 's' has no fixed size)".into());
        }
        if opt == b'c' && size == 0 {
            return Err("bad argument #1 to 'size' (option 'c0' has no fixed size)".into());
        }
        if !opt.is_ascii_alphanumeric() {
            struct_control(opt, fmt, &mut at, &mut layout, "size")?;
        }
        pos += size;
    }
    Ok(pos)
}

pub(super) fn structs(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set(
        "pack",
        lib_fn(lua, |_, args: MultiValue| {
            let args: Vec<Value> = args.into_iter().collect();
            let Some(Value::String(fmt)) = args.first() else {
                return Err(mlua::Error::runtime(
                    "bad argument #1 to 'pack' (string expected)",
                ));
            };
            struct_pack(&fmt.as_bytes(), &args[1..])
                .map(BytesOut)
                .map_err(mlua::Error::runtime)
        })?,
    )?;
    t.set(
        "unpack",
        lib_fn(
            lua,
            |lua, (fmt, data, start): (LuaString, LuaString, Option<i64>)| {
                struct_unpack(lua, &fmt.as_bytes(), &data.as_bytes(), start.unwrap_or(1))
                    .map_err(mlua::Error::runtime)
            },
        )?,
    )?;
    t.set(
        "size",
        lib_fn(lua, |_, fmt: LuaString| {
            struct_fixed_size(&fmt.as_bytes()).map_err(mlua::Error::runtime)
        })?,
    )?;
    Ok(t)
}
