//! The parser: PTX tokens to the pre-decoded [`Program`].

use std::collections::HashMap;

use crate::ir::*;
use crate::lex::{lex, Tok, Token};
use crate::ParseError;

/// Special registers, each a fixed slot filled when a thread starts.
pub(crate) const SPECIALS: &[&str] = &[
    "%tid.x",
    "%tid.y",
    "%tid.z",
    "%ntid.x",
    "%ntid.y",
    "%ntid.z",
    "%ctaid.x",
    "%ctaid.y",
    "%ctaid.z",
    "%nctaid.x",
    "%nctaid.y",
    "%nctaid.z",
    "%laneid",
    "%warpid",
    "%nwarpid",
    "%smid",
    "%nsmid",
    "%gridid",
    "%lanemask_eq",
    "%lanemask_lt",
    "%lanemask_le",
    "%lanemask_gt",
    "%lanemask_ge",
    "%dynamic_smem_size",
    "%total_smem_size",
];
/// The slot `_` sinks write to.
pub(crate) const SINK: Slot = SPECIALS.len() as Slot;
/// The carry flag of `add.cc`/`addc`.
pub(crate) const CARRY: Slot = SINK + 1;
/// The first slot a function's registers and constants take; those below are every thread's.
pub(crate) const FIRST_FREE: Slot = CARRY + 1;

/// Where a symbol lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SymSpace {
    Shared,
    /// `extern .shared` arrays: the dynamic shared memory.
    DynShared,
    Local,
    KernelParam,
    FuncParam,
    /// A module-scope `.global` or `.const` variable; its `offset` is its index in
    /// [`Program::globals`], its address is given at launch.
    Module,
}

/// A variable or parameter.
#[derive(Debug, Clone)]
pub(crate) struct Symbol {
    pub space: SymSpace,
    pub size: usize,
    pub align: usize,
    /// Module-wide offset (local, func param) or kernel param offset; shared is per kernel.
    pub offset: usize,
}

/// A value a constant slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ConstSrc {
    Imm(u64),
    Sym(usize),
}

/// A `.entry` or `.func`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Func {
    pub name: String,
    pub entry: bool,
    pub defined: bool,
    pub params: Vec<usize>,
    pub rets: Vec<usize>,
    pub start: u32,
    /// Shared symbols declared in the body or module-scope ones it references.
    pub shared: Vec<usize>,
    /// Functions it calls.
    pub calls: Vec<usize>,
    /// Module variables (indices in [`Program::globals`]) it references.
    pub globals: Vec<usize>,
    /// The register slots its body declared or made (its constants but those an earlier
    /// function made first, which share their slot and are never written).
    pub slots: std::ops::Range<Slot>,
}

/// A parsed module.
#[derive(Debug)]
pub(crate) struct Program {
    pub version: (u32, u32),
    pub target: String,
    pub code: Vec<Inst>,
    pub funcs: Vec<Func>,
    pub syms: Vec<Symbol>,
    pub consts: Vec<(Slot, ConstSrc)>,
    pub nslots: u32,
    pub local_bytes: usize,
    pub fparam_bytes: usize,
    /// Module-scope `.global`/`.const` variables, in declaration order.
    pub globals: Vec<crate::GlobalVariable>,
}

/// Base address of func-param space (kernel params occupy [0, param_bytes)).
pub(crate) const FPARAM_BASE: u64 = 1 << 40;

#[derive(Debug, Clone)]
pub(crate) enum Imm {
    Int(u64),
    /// A float literal: the f64 value (`0f` literals are exact in f64).
    Float(f64),
}

#[derive(Debug, Clone)]
pub(crate) enum Raw {
    Name(String),
    Pair(String, String),
    Not(String),
    Imm(Imm),
    Vec(Vec<String>),
    Addr(Option<String>, i64),
    List(Vec<String>),
}

#[derive(Debug, Clone, Copy)]
enum Named {
    Reg(Slot),
    Sym(usize),
}

struct PendingCall {
    inst: usize,
    func: usize,
    args: Vec<usize>,
    rets: Vec<usize>,
    line: usize,
}

pub(crate) struct Parser {
    toks: Vec<Token>,
    pos: usize,
    prog: Program,
    const_map: HashMap<ConstSrc, Slot>,
    func_map: HashMap<String, usize>,
    module_scope: HashMap<String, Named>,
    scopes: Vec<HashMap<String, Named>>,
    cur_func: usize,
    labels: HashMap<String, u32>,
    label_fixups: Vec<(usize, String, usize)>,
    calls: Vec<PendingCall>,
    module_shared: Vec<usize>,
}

fn err<T>(line: usize, message: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError {
        line,
        message: message.into(),
    })
}

/// Parses a PTX module.
pub(crate) fn parse(text: &str) -> Result<Program, ParseError> {
    let toks = lex(text)?;
    let mut p = Parser {
        toks,
        pos: 0,
        prog: Program {
            version: (0, 0),
            target: String::new(),
            code: Vec::new(),
            funcs: Vec::new(),
            syms: Vec::new(),
            consts: Vec::new(),
            nslots: FIRST_FREE,
            local_bytes: 0,
            fparam_bytes: 0,
            globals: Vec::new(),
        },
        const_map: HashMap::new(),
        func_map: HashMap::new(),
        module_scope: HashMap::new(),
        scopes: Vec::new(),
        cur_func: 0,
        labels: HashMap::new(),
        label_fixups: Vec::new(),
        calls: Vec::new(),
        module_shared: Vec::new(),
    };
    p.module()?;
    p.finish()
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a.max(1)) * a.max(1)
}

impl Parser {
    fn line(&self) -> usize {
        self.toks
            .get(self.pos)
            .or(self.toks.last())
            .map_or(1, |t| t.line)
    }
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }
    fn next(&mut self) -> Result<Tok, ParseError> {
        match self.toks.get(self.pos) {
            Some(t) => {
                self.pos += 1;
                Ok(t.tok.clone())
            }
            None => err(self.line(), "unexpected end of module"),
        }
    }
    fn is_punct(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Punct(c))
    }
    fn expect(&mut self, c: char) -> Result<(), ParseError> {
        let line = self.line();
        match self.next()? {
            Tok::Punct(x) if x == c => Ok(()),
            t => err(line, format!("expected `{c}`, found {}", show(&t))),
        }
    }
    fn ident(&mut self) -> Result<String, ParseError> {
        let line = self.line();
        match self.next()? {
            Tok::Ident(s) => Ok(s),
            t => err(line, format!("expected a name, found {}", show(&t))),
        }
    }
    fn number(&mut self) -> Result<u64, ParseError> {
        let line = self.line();
        match self.next()? {
            Tok::Num(s) => match parse_int(&s) {
                Some(v) => Ok(v),
                None => err(line, format!("bad integer `{s}`")),
            },
            t => err(line, format!("expected a number, found {}", show(&t))),
        }
    }
    /// Skips the rest of the current line (`.loc`, `.file`).
    fn skip_line(&mut self, line: usize) {
        while self.toks.get(self.pos).is_some_and(|t| t.line == line) {
            self.pos += 1;
        }
    }

    fn module(&mut self) -> Result<(), ParseError> {
        let mut external = false;
        while let Some(tok) = self.peek().cloned() {
            let line = self.line();
            let Tok::Ident(d) = tok else {
                return err(line, format!("unexpected {}", show(&tok)));
            };
            self.pos += 1;
            match d.as_str() {
                ".version" => {
                    let t = self.next()?;
                    let Tok::Num(v) = t else {
                        return err(line, "bad .version");
                    };
                    let mut it = v.split('.');
                    let maj = it.next().and_then(|x| x.parse().ok());
                    let min = it.next().and_then(|x| x.parse().ok());
                    match (maj, min) {
                        (Some(a), Some(b)) => self.prog.version = (a, b),
                        _ => return err(line, format!("bad .version `{v}`")),
                    }
                }
                ".target" => {
                    self.prog.target = self.ident()?;
                    while self.is_punct(',') {
                        self.pos += 1;
                        self.ident()?;
                    }
                }
                ".address_size" => {
                    let n = self.number()?;
                    if n != 64 {
                        return err(line, format!(".address_size {n} is not supported"));
                    }
                }
                ".visible" | ".weak" | ".common" => continue,
                ".extern" => {
                    external = true;
                    continue;
                }
                ".entry" | ".func" => self.function(d == ".entry")?,
                ".shared" => {
                    let ids = self.var_decl(SymSpace::Shared, line)?;
                    for (name, id) in ids {
                        self.module_scope.insert(name, Named::Sym(id));
                        self.module_shared.push(id);
                    }
                }
                ".file" | ".loc" => self.skip_line(line),
                ".pragma" => {
                    self.next()?;
                    self.expect(';')?;
                }
                ".global" | ".const" => self.global_decl(d == ".const", external, line)?,
                _ => return err(line, format!("unknown directive `{d}`")),
            }
            external = false;
        }
        Ok(())
    }

    /// Declares symbols after `.shared`/`.local`/`.param`: `[.align N] [.vN] .type name[[K]] (, name)* ;`
    fn var_decl(
        &mut self,
        space: SymSpace,
        line: usize,
    ) -> Result<Vec<(String, usize)>, ParseError> {
        let (align, elem) = self.decl_attrs(line)?;
        let mut out = Vec::new();
        loop {
            let name = self.ident()?;
            let mut size = elem;
            let mut sp = space;
            if self.is_punct('[') {
                self.pos += 1;
                if self.is_punct(']') {
                    if space != SymSpace::Shared {
                        return err(line, format!("unsized array `{name}` outside .shared"));
                    }
                    sp = SymSpace::DynShared;
                    size = 0;
                } else {
                    let n = self.number()? as usize;
                    size = elem.saturating_mul(n);
                }
                self.expect(']')?;
            }
            if self.is_punct('=') {
                return err(line, format!("initialisers are not supported (`{name}`)"));
            }
            let id = self.add_sym(sp, size, align.unwrap_or(elem.max(1)));
            out.push((name, id));
            if self.is_punct(',') {
                self.pos += 1;
                continue;
            }
            self.expect(';')?;
            return Ok(out);
        }
    }

    /// `.align N`, `.vN`, `.ptr`, state-space qualifiers and the type: (align, element size).
    fn decl_attrs(&mut self, line: usize) -> Result<(Option<usize>, usize), ParseError> {
        let (align, ty, vec) = self.decl_type(line)?;
        Ok((align, ty.bytes() * vec))
    }

    /// As [`Parser::decl_attrs`]: (align, type, vector length).
    fn decl_type(&mut self, line: usize) -> Result<(Option<usize>, Ty, usize), ParseError> {
        let mut align = None;
        let mut vec = 1;
        loop {
            let Some(Tok::Ident(a)) = self.peek().cloned() else {
                return err(line, "expected a type");
            };
            self.pos += 1;
            match a.as_str() {
                ".align" => {
                    let n = self.number()? as usize;
                    if !n.is_power_of_two() {
                        return err(line, format!("bad .align {n}"));
                    }
                    align = Some(n);
                }
                ".v2" => vec = 2,
                ".v4" => vec = 4,
                ".ptr" | ".global" | ".shared" | ".local" | ".const" => {}
                t => match t.strip_prefix('.').and_then(Ty::parse) {
                    Some(ty) => return Ok((align, ty, vec)),
                    None => return err(line, format!("unknown type `{t}`")),
                },
            }
        }
    }

    /// A module-scope `.global`/`.const` declaration (after the state space):
    /// `[.align N] [.vN] .type name[[K]]... [= initialiser] (, ...)* ;`.
    fn global_decl(&mut self, konst: bool, external: bool, line: usize) -> Result<(), ParseError> {
        let (align, ty, vec) = self.decl_type(line)?;
        let elem = ty.bytes() * vec;
        loop {
            let name = self.ident()?;
            if external {
                return err(
                    line,
                    format!("`.extern` module variable `{name}` (defined in another module) is not supported"),
                );
            }
            let mut count = 1usize;
            while self.is_punct('[') {
                self.pos += 1;
                if self.is_punct(']') {
                    return err(line, format!("unsized module variable `{name}[]`"));
                }
                let n = self.number()?;
                count = usize::try_from(n)
                    .ok()
                    .and_then(|n| count.checked_mul(n))
                    .filter(|&c| c.saturating_mul(elem) <= 1 << 32)
                    .ok_or_else(|| ParseError {
                        line,
                        message: format!("module variable `{name}` is too large"),
                    })?;
                self.expect(']')?;
            }
            let size = count * elem;
            let mut initial = vec![0u8; size];
            if self.is_punct('=') {
                self.pos += 1;
                let mut vals = Vec::new();
                self.initialiser(&name, line, &mut vals)?;
                let w = ty.bytes();
                if vals.len() * w > size {
                    return err(
                        line,
                        format!(
                            "initialiser of `{name}` has {} elements, more than its {}",
                            vals.len(),
                            size / w.max(1)
                        ),
                    );
                }
                for (i, v) in vals.iter().enumerate() {
                    let bits = imm_bits(v, ty).to_le_bytes();
                    initial[i * w..(i + 1) * w].copy_from_slice(&bits[..w]);
                }
            }
            let align = align.unwrap_or(elem.max(1));
            let index = self.prog.globals.len();
            self.prog.globals.push(crate::GlobalVariable {
                name: name.clone(),
                space: if konst {
                    crate::VarSpace::Const
                } else {
                    crate::VarSpace::Global
                },
                size,
                align,
                initial,
            });
            let id = self.add_sym(SymSpace::Module, size, align);
            self.prog.syms[id].offset = index;
            self.module_scope.insert(name, Named::Sym(id));
            if self.is_punct(',') {
                self.pos += 1;
                continue;
            }
            return self.expect(';');
        }
    }

    /// An initialiser: a scalar or a `{ }` list (nested lists flattened), appended to `out`.
    fn initialiser(
        &mut self,
        var: &str,
        line: usize,
        out: &mut Vec<Imm>,
    ) -> Result<(), ParseError> {
        if self.is_punct('{') {
            self.pos += 1;
            if self.is_punct('}') {
                self.pos += 1;
                return Ok(());
            }
            loop {
                self.initialiser(var, line, out)?;
                match self.next()? {
                    Tok::Punct(',') => {}
                    Tok::Punct('}') => return Ok(()),
                    t => {
                        return err(
                            line,
                            format!("unexpected {} in the initialiser of `{var}`", show(&t)),
                        )
                    }
                }
            }
        }
        let neg = if self.is_punct('-') {
            self.pos += 1;
            true
        } else {
            false
        };
        match self.next()? {
            Tok::Num(s) => {
                let imm = parse_imm(&s).ok_or_else(|| ParseError {
                    line,
                    message: format!("bad number `{s}` in the initialiser of `{var}`"),
                })?;
                out.push(match (imm, neg) {
                    (Imm::Int(v), true) => Imm::Int(v.wrapping_neg()),
                    (Imm::Float(f), true) => Imm::Float(-f),
                    (i, false) => i,
                });
                Ok(())
            }
            Tok::Ident(n) => err(
                line,
                format!(
                    "the initialiser of `{var}` takes the address of `{n}`: addresses in initialisers are not supported"
                ),
            ),
            t => err(
                line,
                format!("unexpected {} in the initialiser of `{var}`", show(&t)),
            ),
        }
    }

    fn add_sym(&mut self, space: SymSpace, size: usize, align: usize) -> usize {
        let offset = match space {
            SymSpace::Local => {
                let o = align_up(self.prog.local_bytes, align);
                self.prog.local_bytes = o + size;
                o
            }
            SymSpace::FuncParam => {
                let o = align_up(self.prog.fparam_bytes, align);
                self.prog.fparam_bytes = o + size;
                o
            }
            _ => 0,
        };
        self.prog.syms.push(Symbol {
            space,
            size,
            align,
            offset,
        });
        self.prog.syms.len() - 1
    }

    /// `( .param ... , ... )` lists: symbol ids and names.
    fn param_list(
        &mut self,
        space: SymSpace,
        line: usize,
    ) -> Result<Vec<(String, usize)>, ParseError> {
        self.expect('(')?;
        let mut out = Vec::new();
        let mut kparam_end = 0;
        while !self.is_punct(')') {
            let d = self.ident()?;
            if d != ".param" && d != ".reg" {
                return err(line, format!("unknown parameter kind `{d}`"));
            }
            let (align, elem) = self.decl_attrs(line)?;
            let name = self.ident()?;
            let mut size = elem;
            if self.is_punct('[') {
                self.pos += 1;
                let n = self.number()? as usize;
                size = elem.saturating_mul(n);
                self.expect(']')?;
            }
            let align = align.unwrap_or(elem.max(1));
            let id = self.add_sym(space, size, align);
            if space == SymSpace::KernelParam {
                let o = align_up(kparam_end, align);
                self.prog.syms[id].offset = o;
                kparam_end = o + size;
            }
            out.push((name, id));
            if self.is_punct(',') {
                self.pos += 1;
            }
        }
        self.expect(')')?;
        Ok(out)
    }

    fn function(&mut self, entry: bool) -> Result<(), ParseError> {
        let line = self.line();
        let space = if entry {
            SymSpace::KernelParam
        } else {
            SymSpace::FuncParam
        };
        let rets = if !entry && self.is_punct('(') {
            self.param_list(space, line)?
        } else {
            Vec::new()
        };
        let name = self.ident()?;
        let params = if self.is_punct('(') {
            self.param_list(space, line)?
        } else {
            Vec::new()
        };
        // Performance directives and `.noreturn`.
        while let Some(Tok::Ident(d)) = self.peek().cloned() {
            match d.as_str() {
                ".maxntid" | ".reqntid" | ".minnctapersm" | ".maxnreg" | ".maxnctapersm"
                | ".reqnctapercluster" | ".maxclusterrank" | ".explicitcluster" | ".noreturn" => {
                    self.pos += 1;
                    while matches!(self.peek(), Some(Tok::Num(_))) {
                        self.pos += 1;
                        if self.is_punct(',') {
                            self.pos += 1;
                        }
                    }
                }
                ".pragma" => {
                    self.pos += 1;
                    self.next()?;
                    self.expect(';')?;
                }
                _ => return err(self.line(), format!("unknown directive `{d}`")),
            }
        }
        // Reuse a prototype's symbols (its parameter names may differ from the definition's).
        let idx = match self.func_map.get(&name) {
            Some(&i) => {
                let f = &self.prog.funcs[i];
                if f.defined
                    || f.entry != entry
                    || f.params.len() != params.len()
                    || f.rets.len() != rets.len()
                {
                    return err(line, format!("`{name}` declared twice"));
                }
                i
            }
            None => {
                self.prog.funcs.push(Func {
                    name: name.clone(),
                    entry,
                    params: params.iter().map(|p| p.1).collect(),
                    rets: rets.iter().map(|p| p.1).collect(),
                    ..Func::default()
                });
                self.func_map
                    .insert(name.clone(), self.prog.funcs.len() - 1);
                self.prog.funcs.len() - 1
            }
        };
        if self.is_punct(';') {
            self.pos += 1;
            return Ok(());
        }
        let mut scope = HashMap::new();
        let f = &self.prog.funcs[idx];
        for ((n, _), &id) in params.iter().zip(&f.params).chain(rets.iter().zip(&f.rets)) {
            scope.insert(n.clone(), Named::Sym(id));
        }
        self.prog.funcs[idx].defined = true;
        self.prog.funcs[idx].start = self.prog.code.len() as u32;
        self.cur_func = idx;
        self.scopes = vec![scope];
        self.labels.clear();
        self.label_fixups.clear();
        self.expect('{')?;
        let first = self.prog.nslots;
        self.body()?;
        self.prog.funcs[idx].slots = first..self.prog.nslots;
        for (inst, label, line) in std::mem::take(&mut self.label_fixups) {
            let Some(&t) = self.labels.get(&label) else {
                return err(line, format!("unknown label `{label}`"));
            };
            match &mut self.prog.code[inst].op {
                Op::Bra { target } | Op::BraIf { target, .. } => *target = t,
                _ => return err(line, "internal: label fixup on a non-branch"),
            }
        }
        // A body that falls off its end returns.
        self.push(Op::Ret, NO_GUARD, false, self.line());
        Ok(())
    }

    fn body(&mut self) -> Result<(), ParseError> {
        loop {
            let line = self.line();
            let tok = self.next()?;
            match tok {
                Tok::Punct('{') => self.scopes.push(HashMap::new()),
                Tok::Punct('}') => {
                    self.scopes.pop();
                    if self.scopes.is_empty() {
                        return Ok(());
                    }
                }
                Tok::Punct('@') => {
                    let neg = if self.is_punct('!') {
                        self.pos += 1;
                        true
                    } else {
                        false
                    };
                    let p = self.ident()?;
                    let g = match self.lookup(&p) {
                        Some(Named::Reg(s)) => s,
                        _ => return err(line, format!("unknown predicate `{p}`")),
                    };
                    let op = self.ident()?;
                    self.instruction(&op, g, neg, line)?;
                }
                Tok::Ident(d) if d == ".reg" => self.reg_decl(line)?,
                Tok::Ident(d) if d == ".shared" || d == ".local" || d == ".param" => {
                    let space = match d.as_str() {
                        ".shared" => SymSpace::Shared,
                        ".local" => SymSpace::Local,
                        _ => SymSpace::FuncParam,
                    };
                    for (name, id) in self.var_decl(space, line)? {
                        if matches!(space, SymSpace::Shared)
                            || self.prog.syms[id].space == SymSpace::DynShared
                        {
                            self.prog.funcs[self.cur_func].shared.push(id);
                        }
                        self.declare(name, Named::Sym(id));
                    }
                }
                Tok::Ident(d) if d == ".pragma" => {
                    self.next()?;
                    self.expect(';')?;
                }
                Tok::Ident(d) if d == ".loc" || d == ".file" => self.skip_line(line),
                Tok::Ident(d) if self.is_punct(':') => {
                    self.pos += 1;
                    if self
                        .labels
                        .insert(d.clone(), self.prog.code.len() as u32)
                        .is_some()
                    {
                        return err(line, format!("label `{d}` defined twice"));
                    }
                }
                Tok::Ident(d) if d.starts_with('.') => {
                    return err(line, format!("unknown directive `{d}`"))
                }
                Tok::Ident(op) => self.instruction(&op, NO_GUARD, false, line)?,
                t => return err(line, format!("unexpected {}", show(&t))),
            }
        }
    }

    fn declare(&mut self, name: String, n: Named) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name, n);
        }
    }

    fn lookup(&self, name: &str) -> Option<Named> {
        for s in self.scopes.iter().rev() {
            if let Some(&n) = s.get(name) {
                return Some(n);
            }
        }
        self.module_scope.get(name).copied()
    }

    fn reg_decl(&mut self, line: usize) -> Result<(), ParseError> {
        let t = self.ident()?;
        if t == ".v2" || t == ".v4" {
            return err(line, "vector registers are not supported");
        }
        if t.strip_prefix('.').and_then(Ty::parse).is_none() {
            return err(line, format!("unknown register type `{t}`"));
        }
        loop {
            let name = self.ident()?;
            if self.is_punct('<') {
                self.pos += 1;
                let n = self.number()?;
                self.expect('>')?;
                if n > 1 << 20 {
                    return err(line, format!("too many registers `{name}<{n}>`"));
                }
                for i in 0..n {
                    let s = self.new_slot();
                    self.declare(format!("{name}{i}"), Named::Reg(s));
                }
            } else {
                let s = self.new_slot();
                self.declare(name, Named::Reg(s));
            }
            if self.is_punct(',') {
                self.pos += 1;
                continue;
            }
            return self.expect(';');
        }
    }

    fn new_slot(&mut self) -> Slot {
        let s = self.prog.nslots;
        self.prog.nslots += 1;
        s
    }

    fn const_slot(&mut self, c: ConstSrc) -> Slot {
        if let Some(&s) = self.const_map.get(&c) {
            return s;
        }
        let s = self.new_slot();
        self.const_map.insert(c, s);
        self.prog.consts.push((s, c));
        s
    }

    fn push(&mut self, op: Op, guard: Slot, neg: bool, line: usize) {
        self.prog.code.push(Inst {
            op,
            guard,
            neg,
            line: line as u32,
        });
    }

    /// Items read by `item`, separated by commas, up to and including `close`; with `empty`,
    /// there may be none. `what` names the construct in errors.
    fn separated<T>(
        &mut self,
        close: char,
        empty: bool,
        what: &str,
        line: usize,
        mut item: impl FnMut(&mut Self) -> Result<T, ParseError>,
    ) -> Result<Vec<T>, ParseError> {
        let mut out = Vec::new();
        if empty && self.is_punct(close) {
            self.pos += 1;
            return Ok(out);
        }
        loop {
            out.push(item(self)?);
            match self.next()? {
                Tok::Punct(',') => {}
                Tok::Punct(c) if c == close => return Ok(out),
                t => return err(line, format!("unexpected {} in {what}", show(&t))),
            }
        }
    }

    /// Operands up to `;`.
    fn operands(&mut self, line: usize) -> Result<Vec<Raw>, ParseError> {
        self.separated(';', true, "operands", line, |p| p.operand(line))
    }

    fn operand(&mut self, line: usize) -> Result<Raw, ParseError> {
        let t = self.next()?;
        match t {
            Tok::Punct('[') => {
                let mut base = None;
                let mut off: i64 = 0;
                let mut first = true;
                loop {
                    let t = self.next()?;
                    match t {
                        Tok::Punct(']') => break,
                        Tok::Ident(n) if first => base = Some(n),
                        Tok::Num(_) | Tok::Punct('+') | Tok::Punct('-') => {
                            self.pos -= 1;
                            if !first && self.is_punct('+') {
                                self.pos += 1;
                            }
                            let v = self.signed_int(line)?;
                            off = off.wrapping_add(v);
                        }
                        t => return err(line, format!("unexpected {} in address", show(&t))),
                    }
                    first = false;
                }
                Ok(Raw::Addr(base, off))
            }
            Tok::Punct('{') => self
                .separated('}', false, "vector", line, Self::ident)
                .map(Raw::Vec),
            Tok::Punct('(') => self
                .separated(')', true, "list", line, Self::ident)
                .map(Raw::List),
            Tok::Punct('!') => Ok(Raw::Not(self.ident()?)),
            Tok::Ident(n) => {
                if self.is_punct('|') {
                    self.pos += 1;
                    return Ok(Raw::Pair(n, self.ident()?));
                }
                Ok(Raw::Name(n))
            }
            Tok::Num(_) | Tok::Punct('-') => {
                self.pos -= 1;
                let neg = if self.is_punct('-') {
                    self.pos += 1;
                    true
                } else {
                    false
                };
                let Tok::Num(s) = self.next()? else {
                    return err(line, "expected a number");
                };
                let imm = parse_imm(&s).ok_or_else(|| ParseError {
                    line,
                    message: format!("bad number `{s}`"),
                })?;
                Ok(Raw::Imm(match (imm, neg) {
                    (Imm::Int(v), true) => Imm::Int(v.wrapping_neg()),
                    (Imm::Float(f), true) => Imm::Float(-f),
                    (i, false) => i,
                }))
            }
            t => err(line, format!("unexpected {} in operands", show(&t))),
        }
    }

    fn signed_int(&mut self, line: usize) -> Result<i64, ParseError> {
        let neg = if self.is_punct('-') {
            self.pos += 1;
            true
        } else {
            false
        };
        let v = self.number().map_err(|_| ParseError {
            line,
            message: "bad address offset".into(),
        })? as i64;
        Ok(if neg { v.wrapping_neg() } else { v })
    }

    /// A destination register.
    pub(crate) fn dst(&mut self, r: &Raw, line: usize) -> Result<Slot, ParseError> {
        match r {
            Raw::Name(n) if n == "_" => Ok(SINK),
            Raw::Name(n) => match self.lookup(n) {
                Some(Named::Reg(s)) => Ok(s),
                _ => err(line, format!("`{n}` is not a register")),
            },
            _ => err(line, "expected a destination register"),
        }
    }

    /// A source operand read as `ty`.
    pub(crate) fn src(&mut self, r: &Raw, ty: Ty, line: usize) -> Result<Slot, ParseError> {
        match r {
            Raw::Name(n) => self.name_src(n, line),
            Raw::Imm(i) => {
                let v = imm_bits(i, ty);
                Ok(self.const_slot(ConstSrc::Imm(v)))
            }
            _ => err(line, "expected a register or immediate"),
        }
    }

    /// `%clock`-like operands, read by [`Op::Clock`].
    pub(crate) fn clock_name(r: &Raw) -> bool {
        matches!(r, Raw::Name(n) if n == "%clock" || n == "%clock64" || n == "%globaltimer")
    }

    pub(crate) fn name_src(&mut self, n: &str, line: usize) -> Result<Slot, ParseError> {
        if let Some(i) = SPECIALS.iter().position(|s| *s == n) {
            return Ok(i as Slot);
        }
        match self.lookup(n) {
            Some(Named::Reg(s)) => Ok(s),
            Some(Named::Sym(id)) => {
                self.note_sym(id);
                Ok(self.const_slot(ConstSrc::Sym(id)))
            }
            None => err(line, format!("unknown operand `{n}`")),
        }
    }

    fn note_sym(&mut self, id: usize) {
        let sym = &self.prog.syms[id];
        if sym.space == SymSpace::Module {
            let g = sym.offset;
            let f = &mut self.prog.funcs[self.cur_func];
            if !f.globals.contains(&g) {
                f.globals.push(g);
            }
            return;
        }
        if self.module_shared.contains(&id) && !self.prog.funcs[self.cur_func].shared.contains(&id)
        {
            self.prog.funcs[self.cur_func].shared.push(id);
        }
    }

    pub(crate) fn addr(&mut self, r: &Raw, line: usize) -> Result<Addr, ParseError> {
        match r {
            Raw::Addr(Some(n), off) => Ok(Addr {
                base: self.name_src(n, line)?,
                off: *off,
            }),
            Raw::Addr(None, off) => Ok(Addr {
                base: self.const_slot(ConstSrc::Imm(0)),
                off: *off,
            }),
            _ => err(line, "expected an address `[...]`"),
        }
    }

    pub(crate) fn pred_src(&mut self, r: &Raw, line: usize) -> Result<(Slot, bool), ParseError> {
        match r {
            Raw::Not(n) => Ok((self.name_src(n, line)?, true)),
            r => Ok((self.src(r, Ty::Pred, line)?, false)),
        }
    }

    fn instruction(
        &mut self,
        opcode: &str,
        guard: Slot,
        neg: bool,
        line: usize,
    ) -> Result<(), ParseError> {
        let ops = self.operands(line)?;
        let unknown = || ParseError {
            line,
            message: format!("unknown instruction `{opcode}`"),
        };
        let mut parts = opcode.split('.');
        let base = parts.next().unwrap_or("");
        let mods: Vec<&str> = parts.collect();
        let op = crate::decode::decode(self, base, &mods, &ops, line)
            .map_err(|e| e.unwrap_or_else(unknown))?;
        match op {
            Decoded::Op(op) => self.push(op, guard, neg, line),
            Decoded::Branch(label) => {
                self.label_fixups.push((self.prog.code.len(), label, line));
                let op = if guard == NO_GUARD {
                    Op::Bra { target: 0 }
                } else {
                    Op::BraIf {
                        p: guard,
                        neg,
                        target: 0,
                    }
                };
                self.push(op, NO_GUARD, false, line);
            }
            Decoded::Call { func, args, rets } => {
                self.calls.push(PendingCall {
                    inst: self.prog.code.len(),
                    func,
                    args,
                    rets,
                    line,
                });
                let cur = self.cur_func;
                if !self.prog.funcs[cur].calls.contains(&func) {
                    self.prog.funcs[cur].calls.push(func);
                }
                self.push(Op::Nop, guard, neg, line);
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Program, ParseError> {
        for c in std::mem::take(&mut self.calls) {
            let f = &self.prog.funcs[c.func];
            if !f.defined {
                return err(c.line, format!("call of `{}`, which has no body", f.name));
            }
            if f.params.len() != c.args.len() || f.rets.len() != c.rets.len() {
                return err(
                    c.line,
                    format!("call of `{}` with the wrong number of parameters", f.name),
                );
            }
            let copies = |from: &[usize], to: &[usize], syms: &[Symbol]| -> Vec<ParamCopy> {
                from.iter()
                    .zip(to)
                    .map(|(&a, &b)| {
                        let (sa, sb) = (&syms[a], &syms[b]);
                        (
                            sa.offset as u32,
                            sb.offset as u32,
                            sa.size.min(sb.size) as u32,
                        )
                    })
                    .collect()
            };
            let args = copies(&c.args, &f.params, &self.prog.syms);
            let rets = copies(&f.rets, &c.rets, &self.prog.syms);
            let info = CallInfo {
                func: c.func,
                args,
                rets,
            };
            self.prog.code[c.inst].op = Op::Call(Box::new(info));
        }
        if self.prog.fparam_bytes > u32::MAX as usize / 2 || self.prog.local_bytes > 1 << 32 {
            return err(1, "local or parameter space too large");
        }
        crate::ir::fuse(&mut self.prog.code);
        Ok(self.prog)
    }

    /// Resolves a `call` operand list's names: (callee index, arg symbols, ret symbols).
    pub(crate) fn call_operands(
        &mut self,
        ops: &[Raw],
        line: usize,
    ) -> Result<Decoded, Option<ParseError>> {
        let (rets, rest) = match ops.first() {
            Some(Raw::List(r)) => (r.clone(), &ops[1..]),
            _ => (Vec::new(), ops),
        };
        let (fname, args) = match rest {
            [Raw::Name(f)] => (f.clone(), Vec::new()),
            [Raw::Name(f), Raw::List(a)] => (f.clone(), a.clone()),
            [Raw::Name(_), ..] => {
                return Err(Some(ParseError {
                    line,
                    message: "indirect calls are not supported".into(),
                }))
            }
            _ => {
                return Err(Some(ParseError {
                    line,
                    message: "bad call operands".into(),
                }))
            }
        };
        let Some(&func) = self.func_map.get(&fname) else {
            return Err(Some(ParseError {
                line,
                message: format!("call of unknown function `{fname}`"),
            }));
        };
        let syms = |p: &Parser, names: &[String]| -> Result<Vec<usize>, Option<ParseError>> {
            names
                .iter()
                .map(|n| match p.lookup(n) {
                    Some(Named::Sym(id)) if p.prog.syms[id].space == SymSpace::FuncParam => Ok(id),
                    _ => Err(Some(ParseError {
                        line,
                        message: format!("call argument `{n}` is not a .param"),
                    })),
                })
                .collect()
        };
        let args = syms(self, &args)?;
        let rets = syms(self, &rets)?;
        Ok(Decoded::Call { func, args, rets })
    }
}

/// What decoding one instruction gives.
pub(crate) enum Decoded {
    Op(Op),
    Branch(String),
    Call {
        func: usize,
        args: Vec<usize>,
        rets: Vec<usize>,
    },
}

fn show(t: &Tok) -> String {
    match t {
        Tok::Ident(s) | Tok::Num(s) => format!("`{s}`"),
        Tok::Str(s) => format!("\"{s}\""),
        Tok::Punct(c) => format!("`{c}`"),
    }
}

pub(crate) fn parse_int(s: &str) -> Option<u64> {
    let s = s.strip_suffix('U').unwrap_or(s);
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if let Some(b) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        u64::from_str_radix(b, 2).ok()
    } else if s.len() > 1 && s.starts_with('0') && s.bytes().all(|c| c.is_ascii_digit()) {
        u64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

fn parse_imm(s: &str) -> Option<Imm> {
    if let Some(h) = s.strip_prefix("0f").or_else(|| s.strip_prefix("0F")) {
        if h.len() != 8 {
            return None;
        }
        return u32::from_str_radix(h, 16)
            .ok()
            .map(|b| Imm::Float(f32::from_bits(b) as f64));
    }
    if let Some(h) = s.strip_prefix("0d").or_else(|| s.strip_prefix("0D")) {
        if h.len() != 16 {
            return None;
        }
        return u64::from_str_radix(h, 16)
            .ok()
            .map(|b| Imm::Float(f64::from_bits(b)));
    }
    if let Some(v) = parse_int(s) {
        return Some(Imm::Int(v));
    }
    if s.contains('.') || s.contains('e') || s.contains('E') {
        return s.parse::<f64>().ok().map(Imm::Float);
    }
    None
}

/// An immediate's bits as an operand of type `ty`.
fn imm_bits(i: &Imm, ty: Ty) -> u64 {
    match (i, ty) {
        (Imm::Float(f), Ty::F32) => (*f as f32).to_bits() as u64,
        (Imm::Float(f), Ty::F64) => f.to_bits(),
        (Imm::Float(f), Ty::F16 | Ty::Bf16) => {
            let fmt = ty.half().unwrap_or(crate::float::Half::F16);
            u64::from(crate::float::round_half(*f, 0.0, fmt, crate::ir::Rnd::Rn))
        }
        (Imm::Float(f), _) => f.to_bits(),
        (Imm::Int(v), Ty::F32) => (*v as i64 as f32).to_bits() as u64,
        (Imm::Int(v), Ty::F64) => (*v as i64 as f64).to_bits(),
        (Imm::Int(v), Ty::Pred) => (*v != 0) as u64,
        (Imm::Int(v), t) => {
            let b = t.bits();
            if b >= 64 {
                *v
            } else {
                *v & ((1u64 << b) - 1)
            }
        }
    }
}
