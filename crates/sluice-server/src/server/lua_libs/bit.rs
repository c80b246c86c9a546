//! `bit`: LuaBitOp's 32-bit operations on numbers.

use super::lib_fn;
use mlua::{Lua, Table, Variadic};

/// A number as LuaBitOp reads it: rounded, wrapped to 32 bits.
pub(super) fn tobit(n: f64) -> i32 {
    // Adding 2^52 + 2^51 puts the rounded integer in the low bits of the
    // double's mantissa, as LuaBitOp does.
    (n + 6_755_399_441_055_744.0).to_bits() as u32 as i32
}

pub(super) fn bit(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("tobit", lib_fn(lua, |_, n: f64| Ok(tobit(n)))?)?;
    t.set("bnot", lib_fn(lua, |_, n: f64| Ok(!tobit(n)))?)?;
    t.set("bswap", lib_fn(lua, |_, n: f64| Ok(tobit(n).swap_bytes()))?)?;
    let fold = |f: fn(i32, i32) -> i32| {
        lib_fn(lua, move |_, (first, rest): (f64, Variadic<f64>)| {
            Ok(rest.iter().fold(tobit(first), |acc, &n| f(acc, tobit(n))))
        })
    };
    t.set("band", fold(|a, b| a & b)?)?;
    t.set("bor", fold(|a, b| a | b)?)?;
    t.set("bxor", fold(|a, b| a ^ b)?)?;
    let shift = |f: fn(i32, u32) -> i32| {
        lib_fn(lua, move |_, (n, by): (f64, f64)| {
            Ok(f(tobit(n), (tobit(by) & 31) as u32))
        })
    };
    t.set("lshift", shift(|a, by| ((a as u32) << by) as i32)?)?;
    t.set("rshift", shift(|a, by| ((a as u32) >> by) as i32)?)?;
    t.set("arshift", shift(|a, by| a >> by)?)?;
    t.set("rol", shift(|a, by| (a as u32).rotate_left(by) as i32)?)?;
    t.set("ror", shift(|a, by| (a as u32).rotate_right(by) as i32)?)?;
    t.set(
        "tohex",
        lib_fn(lua, |_, (n, digits): (f64, Option<f64>)| {
            let mut digits = digits.map_or(8, tobit);
            let upper = digits < 0;
            if upper {
                digits = -digits;
            }
            let digits = digits.clamp(1, 8) as usize;
            let v = tobit(n) as u32 as u64;
            let text = if upper {
                format!("{v:0digits$X}")
            } else {
                format!("{v:0digits$x}")
            };
            Ok(text[text.len() - digits..].to_string())
        })?,
    )?;
    Ok(t)
}
