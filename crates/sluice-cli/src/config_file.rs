//! `--config FILE` for `sluice serve` and `sluice node`: a TOML file whose
//! keys are the command's long options (`resp = "0.0.0.0:6379"`, `threads =
//! 2`, `device = ["a.dev", "b.dev"]`), read before the arguments are parsed
//! and handed to clap as if they had been typed, so that a key is checked
//! exactly as its option is. An option given on the command line wins over
//! the file's key. `sluice serve`'s file may also hold a `[redis]` table of
//! Redis parameters (`notify-keyspace-events = "KEA"`), set at start as
//! `CONFIG SET` would and written back by `CONFIG REWRITE`.
//!
//! `--config-example` prints every option as a commented key with its help
//! and default; docs/examples holds that output for both commands.

use anyhow::{bail, Context, Result};
use clap::{Arg, ArgAction, Command};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use toml_edit::{DocumentMut, Item, Value};

/// The commands that take `--config`.
pub const CONFIGURABLE: &[&str] = &["serve", "node"];

/// The table of Redis parameters in `sluice serve`'s file.
pub const REDIS_TABLE: &str = "redis";

/// The option a `[redis]` entry becomes (`name=value`, repeatable).
pub const REDIS_OPTION: &str = "redis-param";

/// Largest configuration file read: a file this large is not one.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Options that are not keys of a file (the file itself, printing it).
const NOT_KEYS: &[&str] = &[
    "config",
    "config-example",
    "help",
    "version",
    // The file's `[redis]` table instead.
    REDIS_OPTION,
];

/// `args` with the keys of the `--config` file of a configurable command
/// put in as options, right after the command's name (the command line
/// keeps every option it names).
pub fn expand(args: Vec<OsString>, cli: &Command) -> Result<Vec<OsString>> {
    let Some(name) = args.get(1).and_then(|a| a.to_str()) else {
        return Ok(args);
    };
    if !CONFIGURABLE.contains(&name) {
        return Ok(args);
    }
    let Some(path) = config_path(&args[2..]) else {
        return Ok(args);
    };
    // Built, so that the global options (`--log-format`) are among each
    // command's own.
    let mut cli = cli.clone();
    cli.build();
    let command = cli
        .find_subcommand(name)
        .with_context(|| format!("`sluice {name}` is not in this build"))?;
    let given = long_options_given(&args[2..]);
    let document = read(&path)?;
    let from_file = options_of(&document, command, &given)
        .with_context(|| format!("{} (--config of `sluice {name}`)", path.display()))?;
    let mut out = Vec::with_capacity(args.len() + from_file.len());
    out.extend(args[..2].iter().cloned());
    out.extend(from_file);
    out.extend(args[2..].iter().cloned());
    Ok(out)
}

/// The file `--config FILE` (or `--config=FILE`) names, if any.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let text = arg.to_string_lossy();
        if text == "--" {
            return None;
        }
        if text == "--config" {
            return iter.next().map(PathBuf::from);
        }
        if let Some(path) = text.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    None
}

/// The long options the command line names (without their dashes).
fn long_options_given(args: &[OsString]) -> Vec<String> {
    args.iter()
        .map(|a| a.to_string_lossy())
        .take_while(|a| a != "--")
        .filter_map(|a| {
            let name = a.strip_prefix("--")?;
            Some(name.split('=').next().unwrap_or(name).to_string())
        })
        .collect()
}

/// Reads and parses a configuration file.
pub fn read(path: &Path) -> Result<DocumentMut> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading the configuration file {}", path.display()))?
        .len();
    if size > MAX_FILE_BYTES {
        bail!(
            "{}: {size} bytes; a configuration file may hold at most {MAX_FILE_BYTES}",
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the configuration file {}", path.display()))?;
    text.parse::<DocumentMut>()
        .with_context(|| format!("{} is not valid TOML", path.display()))
}

/// The options a document's keys stand for, skipping those in `given`.
fn options_of(
    document: &DocumentMut,
    command: &Command,
    given: &[String],
) -> Result<Vec<OsString>> {
    let mut out = Vec::new();
    for (key, item) in document.iter() {
        if key == REDIS_TABLE && command.get_name() == "serve" {
            out.extend(redis_options(item)?);
            continue;
        }
        let name = key.replace('_', "-");
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_long() == Some(name.as_str()) && !NOT_KEYS.contains(&name.as_str()))
        else {
            bail!(
                "unknown key `{key}`: the keys are the long options of `sluice {}` \
                 (see `sluice {} --config-example`)",
                command.get_name(),
                command.get_name()
            );
        };
        if given.iter().any(|g| g == &name) {
            continue;
        }
        out.extend(option_values(&name, arg, item)?);
    }
    Ok(out)
}

/// `--name value` for each value of a key.
fn option_values(name: &str, arg: &Arg, item: &Item) -> Result<Vec<OsString>> {
    let flag = OsString::from(format!("--{name}"));
    let Some(value) = item.as_value() else {
        bail!("`{name}` must be a value, not a table");
    };
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        return match value.as_bool() {
            Some(true) => Ok(vec![flag]),
            Some(false) => Ok(Vec::new()),
            None => bail!("`{name}` is a switch: give true or false"),
        };
    }
    let values: Vec<&Value> = match value.as_array() {
        Some(array) if matches!(arg.get_action(), ArgAction::Append) => array.iter().collect(),
        Some(_) => bail!("`{name}` takes one value, not a list"),
        None => vec![value],
    };
    let mut out = Vec::with_capacity(values.len() * 2);
    for v in values {
        out.push(flag.clone());
        out.push(OsString::from(scalar_text(name, v)?));
    }
    Ok(out)
}

/// A scalar's text as the option takes it (true/false as yes/no).
fn scalar_text(name: &str, value: &Value) -> Result<String> {
    Ok(match value {
        Value::String(s) => s.value().clone(),
        Value::Integer(i) => i.value().to_string(),
        Value::Float(f) => f.value().to_string(),
        Value::Boolean(b) if *b.value() => "yes".into(),
        Value::Boolean(_) => "no".into(),
        _ => bail!("`{name}`: give a string, a number or true/false"),
    })
}

/// `--redis-param name=value` for each entry of the `[redis]` table.
fn redis_options(item: &Item) -> Result<Vec<OsString>> {
    let Some(table) = item.as_table_like() else {
        bail!("`{REDIS_TABLE}` must be a table of Redis parameters");
    };
    let mut out = Vec::new();
    for (name, item) in table.iter() {
        let Some(value) = item.as_value() else {
            bail!("[{REDIS_TABLE}] {name}: give a value");
        };
        out.push(OsString::from(format!("--{REDIS_OPTION}")));
        out.push(OsString::from(format!(
            "{name}={}",
            scalar_text(name, value)?
        )));
    }
    Ok(out)
}

/// Writes `parameters` as the `[redis]` table of the file at `path`,
/// keeping everything else of it (comments included); through a new file
/// renamed over the old one, so a crash leaves one or the other whole.
pub fn rewrite_redis_table(path: &Path, parameters: &[(String, String)]) -> Result<()> {
    let mut document = read(path)?;
    let mut table = toml_edit::Table::new();
    for (name, value) in parameters {
        table.insert(name, toml_edit::value(value.as_str()));
    }
    document.insert(REDIS_TABLE, Item::Table(table));
    let fresh = path.with_extension("toml.rewrite");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&fresh)
            .with_context(|| format!("writing {}", fresh.display()))?;
        file.write_all(document.to_string().as_bytes())?;
        file.sync_all()?;
    }
    std::fs::rename(&fresh, path)
        .with_context(|| format!("replacing {} with {}", path.display(), fresh.display()))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The example of `sluice NAME` (a configurable command of this binary).
pub fn example_of(name: &str) -> String {
    use clap::CommandFactory;
    let mut cli = crate::Cli::command();
    cli.build();
    match cli.find_subcommand(name) {
        Some(command) => example(command),
        None => format!("# `sluice {name}` is not in this build\n"),
    }
}

/// Every option of `command` as a commented key of a configuration file,
/// with its help and default.
pub fn example(command: &Command) -> String {
    let name = command.get_name();
    let mut out = format!(
        "# `sluice {name} --config FILE`: every key is a long option of `sluice {name}`\n\
         # (`--resp ADDR` is `resp = \"ADDR\"`; a list for an option given more than\n\
         # once; true/false for a switch). An option on the command line wins over\n\
         # its key. Printed by `sluice {name} --config-example`.\n"
    );
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if NOT_KEYS.contains(&long) || arg.is_hide_set() {
            continue;
        }
        out.push('\n');
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        for line in wrap(&help, 76) {
            out.push_str(&format!("# {line}\n").replace("# \n", "#\n"));
        }
        out.push_str(&format!("# {long} = {}\n", example_value(arg)));
    }
    if name == "serve" {
        out.push_str(
            "\n# Redis parameters, set at start as CONFIG SET sets them; CONFIG REWRITE\n\
             # writes the ones that differ from their defaults back here.\n\
             # [redis]\n\
             # notify-keyspace-events = \"KEA\"\n",
        );
    }
    out
}

/// The value an example shows for `arg`: its default, else its value name.
fn example_value(arg: &Arg) -> String {
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        return "false".into();
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| toml_scalar(&v.to_string_lossy()))
        .collect();
    let shown = if defaults.is_empty() {
        let name = arg
            .get_value_names()
            .and_then(|n| n.first())
            .map_or_else(|| arg.get_id().as_str().to_uppercase(), |n| n.to_string());
        vec![format!("\"{name}\"")]
    } else {
        defaults
    };
    if matches!(arg.get_action(), ArgAction::Append) {
        format!("[{}]", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// A default as TOML: numbers bare, yes/no as booleans, the rest quoted.
fn toml_scalar(text: &str) -> String {
    if text.parse::<i64>().is_ok() || text.parse::<f64>().is_ok_and(|f| f.is_finite()) {
        return text.into();
    }
    match text {
        "yes" => "true".into(),
        "no" => "false".into(),
        _ => Value::from(text).to_string().trim().to_string(),
    }
}

/// `text`'s paragraphs wrapped at `width` columns (blank lines kept).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for paragraph in text.split("\n\n") {
        if !lines.is_empty() {
            lines.push(String::new());
        }
        let mut line = String::new();
        for word in paragraph.split_whitespace() {
            if !line.is_empty() && line.len() + 1 + word.len() > width {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        if !line.is_empty() {
            lines.push(line);
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Sub {
        Serve {
            #[arg(long)]
            config: Option<PathBuf>,
            #[arg(long = "device", default_value = "data/serve.dev")]
            devices: Vec<PathBuf>,
            #[arg(long, default_value_t = 1)]
            threads: usize,
            #[arg(long)]
            no_pin: bool,
            #[arg(long = "redis-param")]
            redis: Vec<String>,
        },
    }

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn parsed(file: &str, args: &[&str]) -> Result<Sub> {
        use clap::CommandFactory;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, file).unwrap();
        let mut all = os(&["sluice", "serve", "--config", path.to_str().unwrap()]);
        all.extend(os(args));
        let expanded = expand(all, &Cli::command())?;
        Ok(Cli::try_parse_from(expanded)?.command)
    }

    #[test]
    fn keys_become_options_and_the_command_line_wins() {
        let file = "threads = 3\ndevice = [\"a.dev\", \"b.dev\"]\nno_pin = true\n\
                    [redis]\nnotify-keyspace-events = \"KEA\"\n";
        let Sub::Serve {
            devices,
            threads,
            no_pin,
            redis,
            ..
        } = parsed(file, &[]).unwrap();
        assert_eq!(threads, 3);
        assert_eq!(devices, [PathBuf::from("a.dev"), PathBuf::from("b.dev")]);
        assert!(no_pin);
        assert_eq!(redis, ["notify-keyspace-events=KEA"]);
        let Sub::Serve {
            devices, threads, ..
        } = parsed(file, &["--threads", "5", "--device=c.dev"]).unwrap();
        assert_eq!(threads, 5);
        assert_eq!(devices, [PathBuf::from("c.dev")]);
    }

    #[test]
    fn bad_keys_and_values_are_named() {
        let err = parsed("thread = 3\n", &[]).unwrap_err().to_string();
        assert!(err.contains("s.toml"), "{err}");
        let err = format!("{:#}", parsed("thread = 3\n", &[]).unwrap_err());
        assert!(err.contains("unknown key `thread`"), "{err}");
        let err = format!("{:#}", parsed("threads = [1, 2]\n", &[]).unwrap_err());
        assert!(err.contains("takes one value"), "{err}");
        let err = format!("{:#}", parsed("no-pin = \"yes\"\n", &[]).unwrap_err());
        assert!(err.contains("switch"), "{err}");
        // clap checks the value as it checks a typed one.
        assert!(parsed("threads = \"many\"\n", &[]).is_err());
        let err = format!("{:#}", parsed("threads = \n", &[]).unwrap_err());
        assert!(err.contains("not valid TOML"), "{err}");
    }

    #[test]
    fn the_redis_table_is_rewritten_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, "# my server\nthreads = 2 # two cores\n").unwrap();
        let params = [("maxmemory-policy".to_string(), "allkeys-lru".to_string())];
        rewrite_redis_table(&path, &params).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# my server\nthreads = 2 # two cores\n"),
            "{text}"
        );
        assert!(
            text.contains("[redis]\nmaxmemory-policy = \"allkeys-lru\"\n"),
            "{text}"
        );
        rewrite_redis_table(&path, &[]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("maxmemory-policy"), "{text}");
    }

    #[test]
    fn the_example_names_every_option_once() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let text = example(cli.find_subcommand("serve").unwrap());
        assert!(text.contains("# device = [\"data/serve.dev\"]\n"), "{text}");
        assert!(text.contains("# threads = 1\n"), "{text}");
        assert!(text.contains("# no-pin = false\n"), "{text}");
        assert!(!text.contains("# config ="), "{text}");
        // Uncommented, the example is a file that parses to the defaults.
        let is_key = |l: &str| {
            l == "[redis]"
                || l.split_once(" = ")
                    .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        };
        let uncommented: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| is_key(l))
            .map(|l| format!("{l}\n"))
            .collect();
        let document: DocumentMut = uncommented.parse().unwrap();
        assert!(document.contains_key("threads"));
        assert!(document.contains_key("redis"));
        assert!(!document.contains_key("redis-param"), "{uncommented}");
    }
}
