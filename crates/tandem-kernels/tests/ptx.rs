//! Checks of the committed PTX that need no GPU and no `cuda` feature: that it is the PTX of
//! the current kernel sources (kernels and signatures), that the launch code passes each kernel
//! the parameter types it takes (read from `src/backend.rs` itself), and that no instruction is
//! an atomic.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use tandem_kernels::ptx::{
    Kernel, PtxModule, MAX_GRADIENT_BUFFERS, MODULES, NARROW_TARGET, PTX_ISA_VERSION, PTX_TARGET,
    SPAN_TABLE, UPDATE,
};

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = crate_dir().join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The stems of the files in `dir` ending in `.ext`.
fn stems(dir: &Path, ext: &str) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == ext))
        .map(|path| {
            path.file_stem()
                .expect("a file name")
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// The names of the `.entry` points a PTX text defines.
fn entries(ptx: &str) -> BTreeSet<&str> {
    ptx.lines()
        .filter_map(|line| line.split(".entry ").nth(1))
        .filter_map(|rest| rest.split('(').next())
        .collect()
}

/// The PTX parameter types of `entry`, in order (the size, `128`, for a by-value struct).
fn params(ptx: &str, entry: &str) -> Vec<String> {
    let start = ptx
        .find(&format!(".entry {entry}("))
        .unwrap_or_else(|| panic!("no entry {entry}"));
    let list = &ptx[start..];
    let list = &list[..list.find(')').expect("a closing parenthesis")];
    list.lines()
        .filter_map(|line| line.trim().strip_prefix(".param "))
        .map(|decl| {
            let decl = decl.trim_end_matches(',');
            match decl.split_once('[') {
                // `.align 8 .b8 name[128]`: a struct passed by value; keep its size.
                Some((_, size)) => size.trim_end_matches(']').to_string(),
                None => decl.split_whitespace().next().unwrap_or("?").to_string(),
            }
        })
        .collect()
}

/// The index just past the bracket that closes the one at `open` (`(`, `[` or `{`), skipping
/// string literals.
fn closing(text: &str, open: usize) -> usize {
    let bytes = text.as_bytes();
    let mut depth = 0i32;
    let mut in_string = false;
    let mut i = open;
    while i < bytes.len() {
        let c = bytes[i];
        if in_string {
            match c {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match c {
                b'"' => in_string = true,
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                return i + 1;
            }
        }
        i += 1;
    }
    panic!("unbalanced brackets in {:?}", &text[open..])
}

/// `text` split at the top-level occurrences of `sep` (outside brackets and strings), trimmed,
/// empty parts (after a trailing separator) dropped. `<` and `>` count as brackets in types
/// ([`split_type`]), not in code, where they compare.
fn split_top(text: &str, sep: char) -> Vec<&str> {
    split(text, sep, false)
}

/// [`split_top`] for a Rust type, where `<...>` nests.
fn split_type(text: &str, sep: char) -> Vec<&str> {
    split(text, sep, true)
}

fn split(text: &str, sep: char, angles: bool) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut in_string, mut start) = (0i32, false, 0);
    let mut previous = ' ';
    for (i, c) in text.char_indices() {
        if in_string {
            if c == '"' && previous != '\\' {
                in_string = false;
            }
        } else {
            match c {
                '"' => in_string = true,
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                '<' if angles => depth += 1,
                '>' if angles && !matches!(previous, '-' | '=') => depth -= 1,
                c if c == sep && depth == 0 => {
                    parts.push(text[start..i].trim());
                    start = i + c.len_utf8();
                }
                _ => {}
            }
        }
        previous = c;
    }
    parts.push(text[start..].trim());
    parts.retain(|p| !p.is_empty());
    parts
}

fn is_identifier(text: &str) -> bool {
    !text.is_empty()
        && !text.starts_with(|c: char| c.is_ascii_digit())
        && text.chars().all(|c| c.is_alphanumeric() || c == '_')
}

#[test]
fn every_kernel_file_has_committed_ptx_and_a_module() {
    let sources = stems(&crate_dir().join("../../kernels"), "cu");
    let committed = stems(&crate_dir().join("ptx"), "ptx");
    let modules: BTreeSet<String> = MODULES.iter().map(|m| m.name.to_string()).collect();
    assert_eq!(sources, committed, "kernels/*.cu against ptx/*.ptx");
    assert_eq!(sources, modules, "kernels/*.cu against ptx::MODULES");
}

/// The `extern "C" __global__` kernels of a `.cu` text: each name with the PTX types of its
/// parameters (pointers and `size_t` `.u64`, `unsigned` and `int` `.u32`, `float` `.f32`, a
/// struct passed by value its size in bytes).
fn cu_kernels(source: &str) -> Vec<(String, Vec<String>)> {
    let marker = "extern \"C\" __global__ void ";
    let mut kernels = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find(marker) {
        let after = &rest[at + marker.len()..];
        let open = after.find('(').expect("a parameter list");
        let name = after[..open].trim().to_string();
        let end = closing(after, open);
        let types = split_top(&after[open + 1..end - 1], ',')
            .into_iter()
            .map(|decl| c_param_type(source, decl))
            .collect();
        kernels.push((name, types));
        rest = &after[end..];
    }
    kernels
}

/// The PTX type of one C parameter declaration (`const float *__restrict__ x`, `size_t len`,
/// `const __grid_constant__ Grads grads`).
fn c_param_type(source: &str, decl: &str) -> String {
    if decl.contains('*') {
        return ".u64".into();
    }
    let words: Vec<&str> = decl
        .split_whitespace()
        .filter(|w| !matches!(*w, "const" | "__restrict__" | "__grid_constant__"))
        .collect();
    let (_name, ty) = words.split_last().expect("a declaration");
    match ty.join(" ").as_str() {
        "size_t" | "unsigned long long" => ".u64".into(),
        "unsigned" | "unsigned int" | "int" => ".u32".into(),
        "float" => ".f32".into(),
        other => c_struct_size(source, other).to_string(),
    }
}

/// The size of `struct name` in a `.cu` text whose fields are 8-byte values (pointers, `unsigned
/// long long`) or arrays of them (`const float *ptr[MAX_GRADS];`), array lengths given as
/// numbers or `#define`d names.
fn c_struct_size(source: &str, name: &str) -> usize {
    let start = source
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("no struct {name}: a parameter type this test cannot size"));
    let open = start + source[start..].find('{').unwrap();
    let body = &source[open + 1..closing(source, open) - 1];
    split_top(body, ';')
        .into_iter()
        .map(|field| {
            assert!(
                field.contains('*') || field.trim().starts_with("unsigned long long "),
                "{name}: field {field:?} is not a pointer or an unsigned long long"
            );
            let count = match field.split_once('[') {
                Some((_, len)) => {
                    let len = len.trim_end_matches(']').trim();
                    len.parse().unwrap_or_else(|_| {
                        let define = format!("#define {len} ");
                        let line = source
                            .lines()
                            .find_map(|l| l.strip_prefix(&define))
                            .unwrap_or_else(|| panic!("no #define {len}"));
                        line.trim().parse::<usize>().expect("a number")
                    })
                }
                None => 1,
            };
            8 * count
        })
        .sum()
}

/// The committed PTX is that of the current sources, as far as can be told without nvcc (CI's
/// `cargo xtask build-kernels --check` compares the text): each module defines exactly the
/// `extern "C" __global__` kernels of its `.cu` file, each with the parameter types its C
/// signature declares.
#[test]
fn the_committed_ptx_has_the_kernels_and_signatures_of_the_sources() {
    for module in MODULES {
        let relative = format!("../../kernels/{}.cu", module.name);
        let kernels = cu_kernels(&read(&relative));
        let names: BTreeSet<&str> = kernels.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            entries(module.ptx),
            "kernels of kernels/{}.cu against ptx/{0}.ptx: run `cargo xtask build-kernels`",
            module.name
        );
        for (name, types) in &kernels {
            assert_eq!(
                &params(module.ptx, name),
                types,
                "parameters of {name} in kernels/{}.cu against ptx/{0}.ptx: run `cargo xtask \
                 build-kernels`",
                module.name
            );
        }
    }
}

#[test]
fn the_launch_code_names_exactly_the_ptx_entry_points() {
    for (index, module) in MODULES.iter().enumerate() {
        let named: BTreeSet<&str> = Kernel::ALL
            .iter()
            .filter(|k| k.module_index() == index)
            .map(|k| k.entry())
            .collect();
        assert_eq!(
            named,
            entries(module.ptx),
            "entry points of {}",
            module.name
        );
    }
}

#[test]
fn modules_are_compiled_for_the_documented_target() {
    for module in MODULES {
        assert!(
            module
                .ptx
                .contains(&format!("\n.version {PTX_ISA_VERSION}\n")),
            "{}: PTX ISA other than {PTX_ISA_VERSION}: update ptx::PTX_ISA_VERSION, \
             ptx::MIN_DRIVER and kernels/README.md",
            module.name
        );
        // The 16-bit module alone needs tensor cores; its source's first line says so.
        let (target, capability) = match module.name {
            "narrow" => (NARROW_TARGET, 80),
            _ => (PTX_TARGET, 75),
        };
        assert!(
            module.ptx.contains(&format!("\n.target {target}\n")),
            "{}: target other than {target}",
            module.name
        );
        assert_eq!(module.capability(), Some(capability), "{}", module.name);
    }
    let names_arch = |m: &&PtxModule| {
        read(&format!("../../kernels/{}.cu", m.name)).starts_with("// nvcc-arch: ")
    };
    let named: Vec<_> = MODULES.iter().filter(names_arch).map(|m| m.name).collect();
    assert_eq!(named, ["narrow"]);
}

/// One instruction of a PTX text.
#[derive(Debug)]
struct Instruction {
    /// The line it starts on (1-based).
    line: usize,
    /// The opcode with its modifiers (`red.global.add.f32`), without a predicate guard.
    opcode: String,
    /// The whole instruction, as written (guard included, without the `;`).
    text: String,
}

/// `line` without its comments (`//` to the end, `/* ... */` anywhere, possibly left open from
/// an earlier line: `in_block` carries that state).
fn strip_comments(line: &str, in_block: &mut bool) -> String {
    let mut kept = String::new();
    let mut rest = line;
    loop {
        if *in_block {
            match rest.find("*/") {
                Some(end) => {
                    rest = &rest[end + 2..];
                    *in_block = false;
                }
                None => return kept,
            }
        } else {
            let line_comment = rest.find("//");
            match rest.find("/*") {
                Some(block) if line_comment.is_none_or(|l| block < l) => {
                    kept.push_str(&rest[..block]);
                    rest = &rest[block + 2..];
                    *in_block = true;
                }
                _ => {
                    kept.push_str(&rest[..line_comment.unwrap_or(rest.len())]);
                    return kept;
                }
            }
        }
    }
}

/// A label (`$L__BB0_2:`) at the start of `text`, removed.
fn strip_label(text: &str) -> &str {
    match text.split_once(':') {
        Some((label, after))
            if !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_alphanumeric() || "_$".contains(c)) =>
        {
            after.trim_start()
        }
        _ => text,
    }
}

/// The instructions of a PTX text. Comments, directives (`.reg`, `.param`, `.visible .entry
/// ...`, `.version`), labels and braces are skipped; a predicate guard (`@%p1`, `@!%p1`) is
/// stripped from the opcode, so that `@%p1 red.global.add.f32 [%rd1], %f1;` has the opcode
/// `red.global.add.f32`. An instruction ends at its `;` and may span lines (`call`); several may
/// share a line.
fn instructions(ptx: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    let mut in_block = false;
    for (index, raw) in ptx.lines().enumerate() {
        let line = strip_comments(raw, &mut in_block);
        let pieces: Vec<&str> = line.split(';').collect();
        for (i, piece) in pieces.iter().enumerate() {
            let terminated = i + 1 < pieces.len();
            match &mut pending {
                Some((_, text)) => {
                    text.push(' ');
                    text.push_str(piece.trim());
                }
                None => {
                    let braces: &[char] = &['{', '}', ' ', '\t'];
                    let piece = strip_label(piece.trim_start_matches(braces));
                    let piece = piece.trim_start_matches(braces).trim_end();
                    let directive = piece.starts_with('.') || piece.starts_with(')');
                    if !piece.is_empty() && !directive {
                        pending = Some((index + 1, piece.to_string()));
                    }
                }
            }
            if terminated {
                if let Some((line, text)) = pending.take() {
                    let text = text.trim().to_string();
                    let unguarded = match text.strip_prefix('@') {
                        Some(guard) => guard
                            .trim_start_matches('!')
                            .trim_start_matches(|c: char| c.is_alphanumeric() || "%_$".contains(c))
                            .trim_start(),
                        None => text.as_str(),
                    };
                    let opcode = unguarded.split_whitespace().next().unwrap_or("").into();
                    out.push(Instruction { line, opcode, text });
                }
            }
        }
    }
    assert!(pending.is_none(), "an instruction without its `;`");
    out
}

/// Whether `opcode` is an atomic or reducing memory operation: `atom.*`, `red.*`, the bulk
/// reductions `cp.reduce.async.bulk*` and the multimem reductions.
fn is_atomic(opcode: &str) -> bool {
    let parts: Vec<&str> = opcode.split('.').collect();
    match parts[0] {
        "atom" | "red" => true,
        "cp" => parts.contains(&"reduce"),
        "multimem" => parts
            .iter()
            .any(|p| p.starts_with("red") || p.contains("reduce")),
        _ => false,
    }
}

/// The parser on a text written to defeat a line-prefix check: guarded atomics, one after a
/// label, one inside braces, commented-out ones, a multi-line `call`, and look-alikes.
#[test]
fn the_instruction_parser_finds_guarded_and_unguarded_atomics() {
    let ptx = "\
.visible .entry k(
\t.param .u64 k_param_0
)
{
\t.reg .pred \t%p<3>;
\t// atom.global.add.f32 in a comment is not an instruction
\tld.param.u64 \t%rd1, [k_param_0]; /* red.global.add.f32 [%rd1], %f1; */
\t@%p1 bra \t$L__BB0_2;
\t@%p1 red.global.add.f32 \t[%rd1], %f1;
\t@!%p2 atom.global.cas.b32 %r1, [%rd1], %r2, %r3;
$L__BB0_2: atom.shared.add.u32 %r4, [%r5], 1;
\t{ red.relaxed.gpu.global.add.s32 [%rd2], 1; }
\tcp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1], [%r1], 16;
\tcall.uni (retval0),
\tvprintf,
\t(param0);
\tadd.f32 %f2, %f1, %f1; mov.f32 %f3, %f2;
\tredux.sync.add.u32 %r6, %r7, -1;
\tret;
}
";
    let found = instructions(ptx);
    let opcodes: Vec<&str> = found.iter().map(|i| i.opcode.as_str()).collect();
    assert_eq!(
        opcodes,
        [
            "ld.param.u64",
            "bra",
            "red.global.add.f32",
            "atom.global.cas.b32",
            "atom.shared.add.u32",
            "red.relaxed.gpu.global.add.s32",
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32",
            "call.uni",
            "add.f32",
            "mov.f32",
            "redux.sync.add.u32",
            "ret",
        ]
    );
    assert_eq!(found[7].text, "call.uni (retval0), vprintf, (param0)");
    let atomic_lines: Vec<usize> = found
        .iter()
        .filter(|i| is_atomic(&i.opcode))
        .map(|i| i.line)
        .collect();
    assert_eq!(atomic_lines, [9, 10, 11, 12, 13]);
}

#[test]
fn atomics_only_count() {
    // Atomic additions of values would make the order of additions, and so the results, vary
    // from run to run. The one atomic allowed adds 1 to an integer counter (a split product's
    // arrivals, `kernels/matmul.cu`): a count is the same in any order, and it decides only
    // which block adds the splits, not in which order.
    let counter = |opcode: &str| opcode == "atom.global.add.u32";
    for module in MODULES {
        let found = instructions(module.ptx);
        // The parser sees the code: every kernel returns, among plenty of instructions.
        let returns = found.iter().filter(|i| i.opcode == "ret").count();
        assert!(
            returns >= entries(module.ptx).len() && found.len() > 20,
            "{}: {} instructions, {returns} ret",
            module.name,
            found.len()
        );
        for instruction in &found {
            assert!(
                !is_atomic(&instruction.opcode) || counter(&instruction.opcode),
                "ptx/{}.ptx line {}: {}",
                module.name,
                instruction.line,
                instruction.text
            );
        }
    }
}

#[test]
fn the_span_table_has_the_size_the_rust_side_passes() {
    // `Spans` travels by value: 8 ends and 8 addresses, as [u64; SPAN_TABLE] in Rust.
    let bytes = SPAN_TABLE * 8;
    assert!(
        UPDATE.contains(&format!(
            ".param .align 8 .b8 sgd_ema_update_param_4[{bytes}]"
        )),
        "the span table is not {bytes} bytes"
    );
}

#[test]
fn the_gradient_table_has_the_size_the_rust_side_passes() {
    // `Grads` travels by value: 16 device pointers, as [u64; MAX_GRADIENT_BUFFERS] in Rust.
    let bytes = MAX_GRADIENT_BUFFERS * 8;
    for param in ["sgd_ema_update_param_2", "mean_gradients_param_1"] {
        assert!(
            UPDATE.contains(&format!(".param .align 8 .b8 {param}[{bytes}]")),
            "{param} is not {bytes} bytes"
        );
    }
}

/// One `self.launch(Kernel::X, grid, block, args![a, b, ...])` of `src/backend.rs`, or one
/// `self.launch_gathered(Kernel::X, shape, batch, args![...])`, which passes the batch's
/// pointers first (as [`GATHERED`] binds them).
struct Launch {
    kernel: String,
    args: Vec<String>,
    /// The text of the function that holds it, from its `fn` to the launch.
    before: String,
    /// That function's parameters, `name: type`.
    params: BTreeMap<String, String>,
}

/// What `launch_gathered` passes before its `args!`: the batch's pointers, bound as this
/// statement binds them.
const GATHERED: &str =
    "let GatheredBatch { images, example_labels, indices, x, labels, .. } = batch;";

/// Every kernel launch in the launch code (not `launch_gathered`'s own call of `launch`,
/// which forwards its caller's kernel).
fn launches(source: &str) -> Vec<Launch> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = source[from..].find("self.launch").map(|i| i + from) {
        let name_end = at + source[at..].find('(').expect("a call");
        let gathered = match &source[at..name_end] {
            "self.launch" => false,
            "self.launch_gathered" => true,
            _ => {
                from = name_end; // `self.launcher()`
                continue;
            }
        };
        let end = closing(source, name_end);
        from = end;
        let call = &source[name_end + 1..end - 1];
        let parts = split_top(call, ',');
        if !gathered && parts[0] == "kernel" {
            continue; // `launch_gathered` forwarding its caller's launch
        }
        let kernel = parts[0]
            .strip_prefix("Kernel::")
            .unwrap_or_else(|| panic!("a launch not naming a Kernel: {call}"))
            .to_string();
        let args = parts
            .last()
            .and_then(|a| a.strip_prefix("args!["))
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or_else(|| panic!("a launch whose last argument is not args![...]: {call}"));
        let batch = match gathered {
            true => vec!["images", "example_labels", "indices", "x", "labels"],
            false => Vec::new(),
        };
        let args: Vec<String> = batch
            .into_iter()
            .chain(split_top(args, ','))
            .map(|a| {
                assert!(
                    is_identifier(a),
                    "{kernel}: args! should name bindings, found {a:?}"
                );
                a.to_string()
            })
            .collect();
        // The enclosing function: the last `fn` that starts a line before the launch.
        let fn_at = source[..at]
            .match_indices("fn ")
            .map(|(i, _)| i)
            .filter(|&i| {
                let line_start = source[..i].rfind('\n').map_or(0, |n| n + 1);
                let prefix = source[line_start..i].trim();
                prefix
                    .split_whitespace()
                    .all(|w| matches!(w, "pub" | "pub(crate)" | "unsafe" | "const"))
            })
            .last()
            .expect("a launch inside a function");
        let signature = &source[fn_at..];
        let open_params = signature.find('(').unwrap();
        let close_params = closing(signature, open_params);
        let params = split_type(&signature[open_params + 1..close_params - 1], ',')
            .into_iter()
            .filter_map(|p| {
                let (name, ty) = p.split_once(':')?;
                let name = name.trim().trim_start_matches("mut ").trim();
                is_identifier(name).then(|| (name.to_string(), ty.trim().to_string()))
            })
            .collect();
        let mut before = source[fn_at..at].to_string();
        if gathered {
            before.push('\n');
            before.push_str(GATHERED);
        }
        out.push(Launch {
            kernel,
            args,
            before,
            params,
        });
    }
    out
}

/// The `let` statements of a function's text, in order: (offset, pattern, expression).
fn lets(body: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (at, _) in body.match_indices("let ") {
        let line_start = body[..at].rfind('\n').map_or(0, |n| n + 1);
        if !body[line_start..at].trim().is_empty() {
            continue; // `if let`, `while let`, or inside an expression
        }
        // The statement ends at the first top-level `;`; the pattern at its first `=` (patterns
        // hold none; `==`, `=>`, `<=` ... come later, in the expression, if at all).
        let Some(statement) = split_top(&body[at + 4..], ';').first().copied() else {
            continue;
        };
        let Some(eq) = statement.find('=') else {
            continue;
        };
        let pattern = statement[..eq].trim().trim_start_matches("mut ").trim();
        let expression = statement[eq + 1..].trim();
        out.push((at, pattern.to_string(), expression.to_string()));
    }
    out
}

/// Reads Rust source text for the types of the bindings a launch passes: an understood
/// handful of forms, and a failure naming anything else, so that a new form of launch code
/// makes the test say so rather than pass unchecked.
struct Types {
    /// `src/backend.rs`, where the helper functions are.
    backend: String,
    /// Where the structs a launch destructures are defined.
    structs: Vec<String>,
}

impl Types {
    /// The Rust type of `name` as bound last in `before` (or a parameter of its function).
    fn of_binding(&self, launch: &Launch, before: &str, name: &str) -> String {
        for (at, pattern, expression) in lets(before).into_iter().rev() {
            // What the expression names is bound before the statement.
            let before = &before[..at];
            if pattern == name {
                return self.of_expression(launch, before, &expression);
            }
            if let Some(inner) = pattern.strip_prefix('(').and_then(|p| p.strip_suffix(')')) {
                let names = split_top(inner, ',');
                if let Some(index) = names.iter().position(|n| *n == name) {
                    let expression = expression.trim_end_matches('?');
                    let elements = match expression.strip_prefix('(') {
                        Some(tuple) => split_top(&tuple[..tuple.len() - 1], ',')
                            .into_iter()
                            .map(|e| self.of_expression(launch, before, e))
                            .collect(),
                        None => {
                            let ty = self.of_expression(launch, before, expression);
                            let inner = ty
                                .strip_prefix('(')
                                .and_then(|t| t.strip_suffix(')'))
                                .unwrap_or_else(|| panic!("{ty} is not a tuple"));
                            split_type(inner, ',')
                                .into_iter()
                                .map(String::from)
                                .collect::<Vec<_>>()
                        }
                    };
                    return elements[index].clone();
                }
            }
            if let Some((type_name, fields)) = pattern.split_once('{') {
                let fields = fields.trim_end_matches('}');
                if split_top(fields, ',').contains(&name) {
                    return self.field_type(type_name.trim(), name);
                }
            }
        }
        launch.params.get(name).cloned().unwrap_or_else(|| {
            panic!(
                "{}: cannot find how `{name}` is bound before the launch",
                launch.kernel
            )
        })
    }

    fn of_expression(&self, launch: &Launch, before: &str, expression: &str) -> String {
        let e = expression.trim().trim_end_matches('?').trim();
        let fail = || -> ! {
            panic!(
                "{}: cannot tell the type of `{e}`: teach this test the new form",
                launch.kernel
            )
        };
        if let Some(scrutinee) = e.strip_prefix("match ") {
            // The type of the first arm.
            let open = scrutinee.find('{').unwrap_or_else(|| fail());
            let arms = &scrutinee[open + 1..closing(scrutinee, open) - 1];
            let first = split_top(arms, ',')
                .into_iter()
                .next()
                .unwrap_or_else(|| fail());
            let (_, value) = first.split_once("=>").unwrap_or_else(|| fail());
            return self.of_expression(launch, before, value);
        }
        if e.ends_with(".as_device_ptr()") {
            return "DevicePointer".into();
        }
        if e.ends_with(".len()") {
            return "usize".into();
        }
        if let Some(literal) = e.strip_prefix(|c: char| c.is_ascii_digit()) {
            let suffix = literal.trim_start_matches(|c: char| c.is_ascii_digit() || c == '_');
            return if suffix.is_empty() {
                fail()
            } else {
                suffix.into()
            };
        }
        if let Some((ty, _)) = e.split_once("::from(") {
            if is_identifier(ty) {
                return ty.into();
            }
        }
        if is_identifier(e) {
            return self.of_binding(launch, before, e);
        }
        // `a.saturating_mul(b)` and the like keep the receiver's type.
        for method in [
            ".saturating_mul(",
            ".saturating_add(",
            ".div_ceil(",
            ".min(",
            ".max(",
        ] {
            if let Some((receiver, _)) = e.split_once(method) {
                if is_identifier(receiver) {
                    return self.of_binding(launch, before, receiver);
                }
            }
        }
        // A call of a free function or a method of the backend: its declared return type, out
        // of `Result`.
        let call = e.strip_prefix("self.").unwrap_or(e);
        if let Some(open) = call.find('(') {
            let (function, e) = (&call[..open], call);
            if is_identifier(function) && closing(e, open) == e.len() {
                return self.returns(function);
            }
        }
        fail()
    }

    /// The return type of the backend's free function or method `name`, unwrapped from
    /// `Result<T, E>`.
    fn returns(&self, name: &str) -> String {
        let declaration = format!("fn {name}");
        let at = self
            .backend
            .match_indices(&declaration)
            .map(|(i, _)| i)
            .find(|&i| {
                let before = self.backend[..i].chars().next_back();
                let next = self.backend[i + declaration.len()..].chars().next();
                matches!(before, Some('\n' | ' ')) && matches!(next, Some('(' | '<'))
            })
            .unwrap_or_else(|| panic!("no fn {name} in src/backend.rs"));
        let signature = &self.backend[at..];
        let arrow = signature.find("->").expect("a return type") + 2;
        let ty = signature[arrow..signature.find('{').unwrap()].trim();
        match ty.strip_prefix("Result<") {
            Some(result) => split_type(&result[..result.len() - 1], ',')[0].to_string(),
            None => ty.to_string(),
        }
    }

    /// The declared type of field `field` of struct `name`.
    fn field_type(&self, name: &str, field: &str) -> String {
        for source in &self.structs {
            if let Some(at) = source.find(&format!("struct {name} {{")) {
                let open = at + source[at..].find('{').unwrap();
                let body = &source[open + 1..closing(source, open) - 1];
                for line in body.lines() {
                    let line = line.trim().trim_start_matches("pub ");
                    if let Some(ty) = line.strip_prefix(&format!("{field}:")) {
                        return ty.trim().trim_end_matches(',').to_string();
                    }
                }
                panic!("struct {name} has no field {field}");
            }
        }
        panic!("no struct {name} in the sources this test reads")
    }
}

/// How a Rust value of `ty` travels as a kernel parameter, in PTX: pointers and 64-bit
/// integers `.u64`, 32-bit integers `.u32` (nvcc declares C `int` parameters `.u32` too), `f32`
/// `.f32`, an array of `u64` by value its size in bytes.
fn ptx_type(ty: &str) -> String {
    match ty {
        t if t.starts_with("DevicePointer") => ".u64".into(),
        "usize" | "u64" => ".u64".into(),
        "u32" | "i32" => ".u32".into(),
        "f32" => ".f32".into(),
        t => {
            let inner = t
                .strip_prefix("[u64;")
                .and_then(|t| t.strip_suffix(']'))
                .unwrap_or_else(|| panic!("no PTX type for the Rust type {t}"))
                .trim();
            let count = match inner {
                "MAX_GRADIENT_BUFFERS" => MAX_GRADIENT_BUFFERS,
                "SPAN_TABLE" => SPAN_TABLE,
                n => n.parse().unwrap_or_else(|_| panic!("array length {n}")),
            };
            (8 * count).to_string()
        }
    }
}

/// The parameter types of every launch, derived from the launch code itself (how each value in
/// its `args![...]` is bound), against the PTX entry's.
#[test]
fn kernel_parameters_match_what_the_launch_code_passes() {
    let types = Types {
        backend: read("src/backend.rs"),
        structs: vec![
            read("../tandem-tensor/src/cpu.rs"),
            read("../tandem-tensor/src/backend.rs"),
            read("src/backend.rs"),
        ],
    };
    let launches = launches(&types.backend);
    let launched: BTreeSet<&str> = launches.iter().map(|l| l.kernel.as_str()).collect();
    let all: BTreeSet<String> = Kernel::ALL.iter().map(|k| format!("{k:?}")).collect();
    assert_eq!(
        launched,
        all.iter().map(String::as_str).collect(),
        "kernels launched in src/backend.rs against Kernel::ALL"
    );
    for launch in &launches {
        let kernel = Kernel::ALL
            .into_iter()
            .find(|k| format!("{k:?}") == launch.kernel)
            .unwrap();
        let rust: Vec<String> = launch
            .args
            .iter()
            .map(|arg| types.of_binding(launch, &launch.before, arg))
            .collect();
        let passed: Vec<String> = rust.iter().map(|t| ptx_type(t)).collect();
        assert_eq!(
            passed,
            params(kernel.module().ptx, kernel.entry()),
            "{}: the launch passes {:?} as {rust:?}",
            kernel.entry(),
            launch.args
        );
    }
}

/// The derivation on a known launch: a mistake in reading the source shows here by name.
#[test]
fn the_launch_reader_sees_the_update_launch() {
    let types = Types {
        backend: read("src/backend.rs"),
        structs: vec![read("../tandem-tensor/src/cpu.rs")],
    };
    let launches = launches(&types.backend);
    let update = launches
        .iter()
        .find(|l| l.kernel == "SgdEmaUpdate")
        .expect("a launch of SgdEmaUpdate");
    let rust: Vec<String> = update
        .args
        .iter()
        .map(|arg| types.of_binding(update, &update.before, arg))
        .collect();
    assert_eq!(
        rust,
        [
            "u64",
            "u64",
            "[u64; MAX_GRADIENT_BUFFERS]",
            "u32",
            "[u64; SPAN_TABLE]",
            "u32",
            "u64",
            "i32",
            "i32",
        ]
    );
}

/// The launch code keeps one function handle per kernel in a table indexed by `Kernel::index`.
#[test]
fn kernel_indices_are_positions_in_all() {
    for (i, kernel) in Kernel::ALL.into_iter().enumerate() {
        assert_eq!(kernel.index(), i, "{kernel:?}");
    }
}
