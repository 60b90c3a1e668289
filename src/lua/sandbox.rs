//! One Luau sandbox: a Lua state with only the globals SPEC §11.1 allows, a CPU budget enforced
//! by the VM interrupt, a memory cap, text chunks only, and the script's `init` already run.
//! A sandbox lives on one OS thread and never leaves it.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlua::chunk::ChunkMode;
use mlua::{Function, Lua, LuaOptions, LuaSerdeExt, LuaString, StdLib, Table, Value, VmState};
use serde_json::Value as Json;

use super::LuaLimits;

/// Why a call failed, by kind (each counted in metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailKind {
    Runtime,
    Cpu,
    Memory,
    Output,
    Timeout,
    Cancelled,
}

impl FailKind {
    pub const ALL: [FailKind; 6] = [
        FailKind::Runtime,
        FailKind::Cpu,
        FailKind::Memory,
        FailKind::Output,
        FailKind::Timeout,
        FailKind::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailKind::Runtime => "runtime",
            FailKind::Cpu => "cpu",
            FailKind::Memory => "memory",
            FailKind::Output => "output",
            FailKind::Timeout => "timeout",
            FailKind::Cancelled => "cancelled",
        }
    }

    /// A breach leaves the state suspect: the sandbox is rebuilt.
    pub fn rebuilds(self) -> bool {
        !matches!(self, FailKind::Runtime | FailKind::Output)
    }
}

/// A failed call: its kind and an operator-readable reason.
#[derive(Debug, Clone)]
pub struct CallError {
    pub kind: FailKind,
    pub message: String,
}

impl CallError {
    pub fn new(kind: FailKind, message: impl Into<String>) -> Self {
        CallError {
            kind,
            message: message.into(),
        }
    }
}

/// A log line a script wrote with `log.info/warn/error`.
#[derive(Debug, Clone)]
pub struct LogLine {
    pub level: &'static str,
    pub message: String,
}

/// Lines a script may log per call, and their size; more are dropped with a notice.
const MAX_LOG_LINES: usize = 100;
const MAX_LOG_BYTES: usize = 4096;
/// Check the clock every this many interrupts (they come at calls and loop back-edges).
const CLOCK_EVERY: u32 = 64;

/// The interrupt's view of the call in progress.
struct Budget {
    deadline: Mutex<Option<Deadline>>,
    cancel: Mutex<Option<Arc<AtomicBool>>>,
    tripped: AtomicBool,
    cancelled: AtomicBool,
    /// The most memory the state was seen to use during the call (sampled with the clock).
    peak: AtomicUsize,
}

/// What one call cost: the sandbox thread's CPU time, and the most memory the state held
/// (sampled when the CPU budget is checked, and at the end of the call, before any
/// collection).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    pub cpu: Duration,
    pub memory_bytes: usize,
}

pub struct Sandbox {
    lua: Lua,
    handle: Function,
    budget: Arc<Budget>,
    logs: Arc<Mutex<Vec<LogLine>>>,
    limits: LuaLimits,
}

/// Builtins Luau would otherwise call directly (a fast call that never reads the global),
/// so removing the global would not remove them. Every removed global that is a builtin,
/// and every function of a removed library that is one.
const DISABLED_BUILTINS: [&str; 15] = [
    "getmetatable",
    "setmetatable",
    "vector.create",
    "vector.magnitude",
    "vector.normalize",
    "vector.cross",
    "vector.dot",
    "vector.floor",
    "vector.ceil",
    "vector.abs",
    "vector.sign",
    "vector.clamp",
    "vector.max",
    "vector.min",
    "vector.lerp",
];

/// The compiler every sandbox's chunks go through.
fn compiler() -> mlua::chunk::Compiler {
    mlua::chunk::Compiler::new().set_disabled_builtins(DISABLED_BUILTINS)
}

/// Compiles `source` as text (the compiler reads no bytecode) without running it: syntax
/// check for config. No Lua state is made (a state costs more than the compile).
pub fn check_syntax(name: &str, source: &str) -> Result<(), String> {
    match compiler().compile(source) {
        Ok(_) => Ok(()),
        // The compiler's message starts at the line number, as a loaded chunk's after its name.
        Err(mlua::Error::SyntaxError { message, .. }) => Err(clean(&format!("{name}:{message}"))),
        Err(e) => Err(clean(&e.to_string())),
    }
}

/// Error text without mlua's wrapping noise.
pub fn clean(message: &str) -> String {
    let m = message
        .trim_start_matches("runtime error: ")
        .trim_start_matches("syntax error: ");
    m.lines().next().unwrap_or(m).trim().to_string()
}

fn describe(e: &mlua::Error) -> String {
    match e {
        mlua::Error::CallbackError {
            traceback: _,
            cause,
        } => describe(cause),
        other => clean(&other.to_string()),
    }
}

/// The globals a script sees: the standard libraries but what could escape or outlast the
/// sandbox (metatables, loading code, `debug`, the file system), `os` with `time` and
/// `clock` only, `log.info/warn/error` (into `logs`, bounded), `json.encode` (bounded by
/// the memory cap) and `json.decode`; then the built-ins are made read-only.
fn install_globals(
    lua: &Lua,
    logs: &Arc<Mutex<Vec<LogLine>>>,
    limits: LuaLimits,
) -> mlua::Result<()> {
    let g = lua.globals();
    for banned in [
        "getmetatable",
        "setmetatable",
        "getfenv",
        "setfenv",
        "loadstring",
        "load",
        "require",
        "collectgarbage",
        "newproxy",
        "gcinfo",
        "print",
        "debug",
        "dofile",
        "loadfile",
        "buffer",
        "vector",
    ] {
        g.raw_set(banned, Value::Nil)?;
    }
    let os: Table = g.get("os")?;
    let safe_os = lua.create_table()?;
    safe_os.set("time", os.get::<Function>("time")?)?;
    safe_os.set("clock", os.get::<Function>("clock")?)?;
    g.raw_set("os", safe_os)?;

    let log = lua.create_table()?;
    for level in ["info", "warn", "error"] {
        let logs = logs.clone();
        log.set(
            level,
            lua.create_function(move |_, message: LuaString| {
                let mut lines = crate::sync::lock(&logs);
                if lines.len() < MAX_LOG_LINES {
                    let text = crate::clip::clip(message.to_string_lossy(), MAX_LOG_BYTES);
                    lines.push(LogLine {
                        level,
                        message: text,
                    });
                }
                Ok(())
            })?,
        )?;
    }
    g.raw_set("log", log)?;

    let json = lua.create_table()?;
    let cap = limits.memory_bytes();
    json.set(
        "encode",
        lua.create_function(move |_, v: Value| {
            let bytes = encode_bounded(&v, cap)?;
            String::from_utf8(bytes).map_err(mlua::Error::external)
        })?,
    )?;
    json.set(
        "decode",
        lua.create_function(|lua, s: LuaString| {
            let value: Json = serde_json::from_slice(&s.as_bytes())
                .map_err(|e| mlua::Error::RuntimeError(format!("json.decode: {e}")))?;
            lua.to_value_with(&value, ser_options())
        })?,
    )?;
    g.raw_set("json", json)?;
    #[cfg(test)]
    g.raw_set(
        "__test_block",
        lua.create_function(|_, ms: u64| {
            // Stands for C code the interrupt cannot reach (unit tests only).
            std::thread::sleep(Duration::from_millis(ms));
            Ok(())
        })?,
    )?;
    lua.sandbox(true)?;
    Ok(())
}

/// The VM interrupt: every [`CLOCK_EVERY`] interrupts (or at once after a trip) it looks at
/// the call's deadline and cancellation, and stops the script when either has come.
fn interrupt_on_budget(lua: &Lua, budget: Arc<Budget>) {
    let counter = Cell::new(0u32);
    lua.set_interrupt(move |lua| {
        let n = counter.get().wrapping_add(1);
        counter.set(n);
        if !n.is_multiple_of(CLOCK_EVERY) && !budget.tripped.load(Ordering::Relaxed) {
            return Ok(VmState::Continue);
        }
        budget.peak.fetch_max(lua.used_memory(), Ordering::Relaxed);
        let cancelled = match budget.cancel.lock() {
            Ok(g) => g.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)),
            Err(_) => false,
        };
        if cancelled {
            budget.cancelled.store(true, Ordering::Relaxed);
            return Err(mlua::Error::RuntimeError(
                "cancelled: the thread was killed".into(),
            ));
        }
        let over = match budget.deadline.lock() {
            Ok(mut g) => g.as_mut().is_some_and(Deadline::passed),
            Err(_) => false,
        };
        if over || budget.tripped.load(Ordering::Relaxed) {
            budget.tripped.store(true, Ordering::Relaxed);
            return Err(mlua::Error::RuntimeError("cpu budget exceeded".into()));
        }
        Ok(VmState::Continue)
    });
}

impl Sandbox {
    /// Builds a sandbox, runs the script's top level and its `init(config)`.
    pub fn new(
        name: &str,
        source: &str,
        config: &Json,
        limits: LuaLimits,
    ) -> Result<Sandbox, String> {
        let libs = StdLib::STRING
            | StdLib::TABLE
            | StdLib::MATH
            | StdLib::UTF8
            | StdLib::BIT
            | StdLib::OS
            | StdLib::COROUTINE;
        let lua = Lua::new_with(libs, LuaOptions::default()).map_err(|e| e.to_string())?;
        lua.set_compiler(compiler());
        let budget = Arc::new(Budget {
            deadline: Mutex::new(None),
            cancel: Mutex::new(None),
            tripped: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
            peak: AtomicUsize::new(0),
        });
        let logs = Arc::new(Mutex::new(Vec::new()));
        install_globals(&lua, &logs, limits)
            .map_err(|e| format!("cannot build the sandbox: {e}"))?;

        interrupt_on_budget(&lua, budget.clone());
        lua.set_memory_limit(limits.memory_bytes())
            .map_err(|e| format!("cannot set the memory limit: {e}"))?;

        let mut sandbox_budget_guard = BudgetGuard::arm(&budget, limits.cpu());
        let chunk = lua
            .load(source)
            .set_name(format!("={name}"))
            .set_mode(ChunkMode::Text)
            .into_function()
            .map_err(|e| format!("does not compile: {}", describe(&e)))?;
        chunk
            .call::<()>(())
            .map_err(|e| format!("top level failed: {}", describe(&e)))?;
        let g = lua.globals();
        let handle: Function = match g.get::<Value>("handle") {
            Ok(Value::Function(f)) => f,
            _ => return Err("the script defines no `handle(payload, meta)` function".into()),
        };
        if let Ok(Value::Function(init)) = g.get::<Value>("init") {
            sandbox_budget_guard.rearm(limits.cpu());
            let cfg = lua
                .to_value_with(config, ser_options())
                .map_err(|e| format!("config cannot be given to init: {e}"))?;
            init.call::<()>(cfg)
                .map_err(|e| format!("init failed: {}", describe(&e)))?;
        }
        drop(sandbox_budget_guard);
        Ok(Sandbox {
            lua,
            handle,
            budget,
            logs,
            limits,
        })
    }

    /// Runs `f`, host code converting bounded input (a payload within `max_message_bytes`,
    /// its meta, the script's return value), with the state's memory limit lifted. Under a
    /// limit, mlua makes every Lua string and table inside a protected call of its own, in
    /// case the allocation fails: two thirds of a conversion's instructions. What `f` adds
    /// still counts: a state over its limit afterwards fails the call as the limit would
    /// have.
    fn unlimited<R>(&self, f: impl FnOnce(&Lua) -> mlua::Result<R>) -> mlua::Result<R> {
        let limit = self.limits.memory_bytes();
        let _ = self.lua.set_memory_limit(0);
        let out = f(&self.lua);
        let _ = self.lua.set_memory_limit(limit);
        let out = out?;
        if limit > 0 && self.lua.used_memory() > limit {
            // Perhaps only garbage holds it over: collected once before the call fails.
            let _ = self.lua.gc_collect();
            if self.lua.used_memory() > limit {
                return Err(mlua::Error::MemoryError("not enough memory".into()));
            }
        }
        Ok(out)
    }

    /// Memory the state uses now, bytes.
    pub fn used_memory(&self) -> usize {
        self.lua.used_memory()
    }

    /// Calls `handle(payload, meta)` under the budget. `payload` is the JSON view of the
    /// payload; the result is the raw return value converted to JSON, plus log lines and what
    /// the call cost (its CPU time only if `clock`: reading the thread's clock is a system
    /// call, too dear for every call).
    pub fn call(
        &self,
        payload: &Json,
        meta: &Json,
        cancel: Arc<AtomicBool>,
        clock: bool,
    ) -> (Result<Json, CallError>, Vec<LogLine>, Cost) {
        let cpu_before = clock.then(crate::time::thread_cpu_time);
        self.budget
            .peak
            .store(self.lua.used_memory(), Ordering::Relaxed);
        if let Ok(mut l) = self.logs.lock() {
            l.clear();
        }
        if let Ok(mut c) = self.budget.cancel.lock() {
            *c = Some(cancel);
        }
        let guard = BudgetGuard::arm(&self.budget, self.limits.cpu());
        let result = (|| -> mlua::Result<Json> {
            let (p, m) = self.unlimited(|lua| {
                Ok((
                    lua.to_value_with(&lua_shape(payload), ser_options())?,
                    lua.to_value_with(meta, ser_options())?,
                ))
            })?;
            let out: Value = self.handle.call((p, m))?;
            if matches!(out, Value::Nil) {
                return Ok(Json::Null);
            }
            // Written out within the memory cap first: a table can hold one large string
            // many times over, and its copies are made on the host side.
            let bytes = encode_bounded(&out, self.limits.memory_bytes())?;
            serde_json::from_slice(&bytes).map_err(mlua::Error::external)
        })();
        let tripped = self.budget.tripped.load(Ordering::Relaxed);
        let cancelled = self.budget.cancelled.load(Ordering::Relaxed);
        drop(guard);
        let cost = Cost {
            cpu: cpu_before.map_or(Duration::ZERO, |before| {
                crate::time::thread_cpu_time().saturating_sub(before)
            }),
            memory_bytes: self
                .budget
                .peak
                .load(Ordering::Relaxed)
                .max(self.lua.used_memory()),
        };
        if let Ok(mut c) = self.budget.cancel.lock() {
            *c = None;
        }
        let logs = match self.logs.lock() {
            Ok(mut l) => std::mem::take(&mut *l),
            Err(_) => Vec::new(),
        };
        let result = match result {
            _ if cancelled => Err(CallError::new(
                FailKind::Cancelled,
                "cancelled: the thread was killed",
            )),
            _ if tripped => Err(CallError::new(
                FailKind::Cpu,
                format!("cpu budget of {} ms exceeded", self.limits.cpu_ms),
            )),
            Ok(v) => Ok(json_shape(v)),
            Err(e) => Err(classify(&e, &self.limits)),
        };
        (result, logs, cost)
    }
}

fn classify(e: &mlua::Error, limits: &LuaLimits) -> CallError {
    match e {
        mlua::Error::MemoryError(_) => CallError::new(
            FailKind::Memory,
            format!("memory limit of {} MB exceeded", limits.memory_mb),
        ),
        mlua::Error::CallbackError { cause, .. } => classify(cause, limits),
        mlua::Error::DeserializeError(m) | mlua::Error::SerializeError(m) => CallError::new(
            FailKind::Output,
            format!("the return value cannot be read: {m}"),
        ),
        other => {
            let text = describe(other);
            if text.contains("not enough memory") {
                CallError::new(
                    FailKind::Memory,
                    format!("memory limit of {} MB exceeded", limits.memory_mb),
                )
            } else {
                CallError::new(FailKind::Runtime, text)
            }
        }
    }
}

/// When a call's CPU budget is spent: when the sandbox's thread has used `budget` of CPU
/// since the call began (its own clock: time the machine gives to others does not count),
/// or, where no thread clock can be read, when `budget` of wall time has passed.
///
/// The thread's clock is a system call (about a microsecond here); the wall clock is not,
/// and a thread cannot use more CPU than time passes. So a call reads the thread's clock at
/// its first check (a call too short to reach one reads it never), then only once the wall
/// clock says the budget could be spent; if it is not (the thread was kept waiting), the
/// next look is put off by what remains.
#[derive(Clone, Copy)]
struct Deadline {
    budget: Duration,
    /// The thread's CPU time at the first check (`None` until then, or without a clock).
    start: Option<Duration>,
    /// Not spent before this instant.
    look: Instant,
}

impl Deadline {
    /// `budget` from now.
    fn after(budget: Duration) -> Deadline {
        Deadline {
            budget,
            start: None,
            look: Instant::now() + budget,
        }
    }

    fn passed(&mut self) -> bool {
        let Some(start) = self.start else {
            let now = crate::time::thread_cpu_time();
            if now.is_zero() {
                // No thread clock: wall time it is.
                return Instant::now() >= self.look;
            }
            self.start = Some(now);
            return false;
        };
        let now = Instant::now();
        if now < self.look {
            return false;
        }
        let used = crate::time::thread_cpu_time().saturating_sub(start);
        if used >= self.budget {
            return true;
        }
        self.look = now + (self.budget - used);
        false
    }
}

/// Arms the CPU deadline for one call; disarms it when dropped.
struct BudgetGuard<'a> {
    budget: &'a Budget,
}

impl<'a> BudgetGuard<'a> {
    fn arm(budget: &'a Budget, cpu: Duration) -> Self {
        let guard = BudgetGuard { budget };
        guard.set(cpu);
        guard
    }

    /// A new budget from now. (Not by assigning a new guard: the old one's `Drop` would
    /// run after the new one was armed, and disarm it.)
    fn rearm(&mut self, cpu: Duration) {
        self.set(cpu);
    }

    fn set(&self, cpu: Duration) {
        self.budget.tripped.store(false, Ordering::Relaxed);
        self.budget.cancelled.store(false, Ordering::Relaxed);
        if let Ok(mut d) = self.budget.deadline.lock() {
            *d = Some(Deadline::after(cpu));
        }
    }
}

impl Drop for BudgetGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut d) = self.budget.deadline.lock() {
            *d = None;
        }
    }
}

fn ser_options() -> mlua::serde::ser::Options {
    mlua::serde::ser::Options::new()
        .serialize_none_to_null(false)
        .serialize_unit_to_null(false)
        .set_array_metatable(false)
}

/// A writer that refuses to grow past `max` bytes.
struct Bounded {
    bytes: Vec<u8>,
    max: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.max {
            return Err(std::io::Error::other("over the memory limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `v` as JSON text, written straight from the Lua value (no copy of the tree in between)
/// and stopped at `max` bytes (the sandbox's memory cap; 0 is none) with a memory error.
fn encode_bounded(v: &Value, max: usize) -> mlua::Result<Vec<u8>> {
    let max = if max == 0 { usize::MAX } else { max };
    let mut out = Bounded {
        bytes: Vec::new(),
        max,
    };
    let value = v
        .to_serializable()
        .deny_unsupported_types(true)
        .deny_recursive_tables(true)
        .sort_keys(true);
    match serde_json::to_writer(&mut out, &value) {
        Ok(()) => Ok(out.bytes),
        Err(e) if e.is_io() => Err(mlua::Error::MemoryError(format!(
            "the value written as JSON is over the {max}-byte memory limit"
        ))),
        Err(e) => Err(mlua::Error::SerializeError(e.to_string())),
    }
}

/// The JSON view of a payload as a Lua table: attributes under `_attr`, mixed text `_text`
/// (SPEC §11.2), instead of `@name` and `#text`.
pub fn lua_shape(v: &Json) -> Json {
    match v {
        Json::Object(map) => {
            let mut out = serde_json::Map::new();
            let mut attrs = serde_json::Map::new();
            for (k, val) in map {
                if let Some(a) = k.strip_prefix('@') {
                    attrs.insert(a.to_string(), val.clone());
                } else if k == "#text" {
                    out.insert("_text".into(), val.clone());
                } else {
                    out.insert(k.clone(), lua_shape(val));
                }
            }
            if !attrs.is_empty() {
                out.insert("_attr".into(), Json::Object(attrs));
            }
            Json::Object(out)
        }
        Json::Array(items) => Json::Array(items.iter().map(lua_shape).collect()),
        other => other.clone(),
    }
}

/// The inverse of [`lua_shape`]: `_attr` and `_text` back to `@name` and `#text`.
pub fn json_shape(v: Json) -> Json {
    match v {
        Json::Object(map) => {
            let mut out = serde_json::Map::new();
            for (k, val) in map {
                if k == "_attr" {
                    if let Json::Object(attrs) = val {
                        for (a, av) in attrs {
                            out.insert(format!("@{a}"), av);
                        }
                    }
                } else if k == "_text" {
                    out.insert("#text".into(), val);
                } else {
                    out.insert(k, json_shape(val));
                }
            }
            Json::Object(out)
        }
        Json::Array(items) => Json::Array(items.into_iter().map(json_shape).collect()),
        other => other,
    }
}

#[cfg(test)]
mod deadline_tests {
    use super::Deadline;
    use std::time::{Duration, Instant};

    #[test]
    #[cfg(target_os = "linux")]
    fn a_cpu_budget_is_spent_by_work_not_by_waiting() {
        let mut d = Deadline::after(Duration::from_millis(20));
        assert!(!d.passed(), "the first check reads the clock");
        assert!(d.start.is_some());
        // Time off the CPU (a busy machine's other work, here a sleep) spends none of it.
        std::thread::sleep(Duration::from_millis(60));
        assert!(!d.passed());
        let started = Instant::now();
        let mut x = 0u64;
        while !d.passed() {
            assert!(started.elapsed() < Duration::from_secs(60), "never spent");
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }
}
