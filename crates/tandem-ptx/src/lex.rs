//! Tokens of PTX text.

use crate::ParseError;

/// A token kind.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// Identifiers, directives (`.reg`), opcodes (`ld.global.f32`), registers (`%tid.x`).
    Ident(String),
    /// Numbers as written (`42`, `0x1f`, `0f3F800000`, `9.0`).
    Num(String),
    /// A string literal's contents.
    Str(String),
    /// One punctuation character.
    Punct(char),
}

/// A token and its 1-based line.
#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub tok: Tok,
    pub line: usize,
}

fn ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || matches!(c, '_' | '$' | '%' | '.')
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.')
}

/// Splits `text` into tokens, dropping comments.
pub(crate) fn lex(text: &str) -> Result<Vec<Token>, ParseError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && chars.get(i + 1) == Some(&'*') {
            let start = line;
            i += 2;
            loop {
                if i + 1 >= chars.len() {
                    return Err(ParseError {
                        line: start,
                        message: "unterminated comment".into(),
                    });
                }
                if chars[i] == '*' && chars[i + 1] == '/' {
                    i += 2;
                    break;
                }
                if chars[i] == '\n' {
                    line += 1;
                }
                i += 1;
            }
        } else if c == '"' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i] != '"' && chars[i] != '\n' {
                i += 1;
            }
            if i >= chars.len() || chars[i] != '"' {
                return Err(ParseError {
                    line,
                    message: "unterminated string".into(),
                });
            }
            out.push(Token {
                tok: Tok::Str(chars[start..i].iter().collect()),
                line,
            });
            i += 1;
        } else if ident_start(c) {
            let start = i;
            i += 1;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            out.push(Token {
                tok: Tok::Ident(chars[start..i].iter().collect()),
                line,
            });
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                // An exponent sign: `1.5e-3`.
                i += 1;
                if i < chars.len()
                    && matches!(chars[i], '+' | '-')
                    && matches!(chars[i - 1], 'e' | 'E')
                    && !chars[start..i]
                        .iter()
                        .any(|c| matches!(c, 'x' | 'X' | 'f' | 'd'))
                {
                    i += 1;
                }
            }
            out.push(Token {
                tok: Tok::Num(chars[start..i].iter().collect()),
                line,
            });
        } else if "{}()[];:,<>+-|!@=".contains(c) {
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        } else {
            return Err(ParseError {
                line,
                message: format!("unexpected character `{c}`"),
            });
        }
    }
    Ok(out)
}
