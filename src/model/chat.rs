//! Chat prompts: the model's own Jinja chat template (`tokenizer.chat_template` in the GGUF)
//! rendered with `minijinja`, set up the way Hugging Face renders chat templates (blocks trimmed
//! and left-stripped, loop controls, `raise_exception`, `strftime_now`, and the common Python
//! string and dict methods that templates call).

use minijinja::value::{from_args, Rest, ValueKind};
use minijinja::{Environment, ErrorKind, Value as JValue};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::model::gguf::GgufFile;
use crate::model::tokenizer::Tokenizer;

/// The GGUF key holding the chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text of the message.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
}

/// A compiled chat template with the BOS/EOS token texts it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles a template. `bos_token` / `eos_token` are the texts the template sees under those
    /// names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<JValue, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", strftime_now);
        env.set_unknown_method_callback(python_method);
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| {
                Error::InvalidArgument(format!("chat template does not compile: {e:#}"))
            })?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// The template stored in the GGUF file (`None` when it has none), with the tokenizer's BOS
    /// and EOS texts.
    pub fn from_gguf(gguf: &GgufFile, tokenizer: &Tokenizer) -> Result<Option<ChatTemplate>> {
        let Some(source) = gguf.opt_str(CHAT_TEMPLATE_KEY)? else {
            return Ok(None);
        };
        let text = |id: Option<u32>| {
            id.and_then(|id| tokenizer.token_str(id))
                .unwrap_or("")
                .to_owned()
        };
        let (bos, eos) = (text(tokenizer.bos_id()), text(tokenizer.eos_id()));
        ChatTemplate::new(source, &bos, &eos)
            .map(Some)
            .map_err(|e| gguf.err(format!("{CHAT_TEMPLATE_KEY}: {e}")))
    }

    /// Renders a conversation; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| Error::InvalidArgument(format!("chat template: {e}")))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        template
            .render(ctx)
            .map_err(|e| Error::InvalidArgument(format!("chat template: {e:#}")))
    }
}

/// `strftime_now(format)`: the current UTC time, for templates that print today's date. Supports
/// `%Y %m %d %B %b %H %M %S %%`; other directives are copied as written.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let tod = secs % 86_400;
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m as usize).clamp(1, 12) - 1];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Year, month, day of a count of days since 1970-01-01 (proleptic Gregorian calendar).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The Python methods HF templates call on strings and dicts, which minijinja does not have.
fn python_method(
    state: &minijinja::State,
    value: &JValue,
    method: &str,
    args: &[JValue],
) -> std::result::Result<JValue, minijinja::Error> {
    if let Some(s) = value.as_str() {
        return string_method(s, method, args);
    }
    if value.kind() == ValueKind::Map {
        return match method {
            "items" | "keys" | "values" => {
                let _: () = from_args(args)?;
                let items = state.apply_filter("items", std::slice::from_ref(value))?;
                if method == "items" {
                    return Ok(items);
                }
                let index = usize::from(method == "values");
                let picked: Vec<JValue> = items
                    .try_iter()?
                    .map(|pair| pair.get_item_by_index(index))
                    .collect::<std::result::Result<_, _>>()?;
                Ok(JValue::from(picked))
            }
            "get" => {
                let (key, default): (JValue, Option<JValue>) = from_args(args)?;
                let found = value.get_item(&key)?;
                Ok(if found.is_undefined() {
                    default.unwrap_or(JValue::from(()))
                } else {
                    found
                })
            }
            _ => Err(minijinja::Error::from(ErrorKind::UnknownMethod)),
        };
    }
    Err(minijinja::Error::from(ErrorKind::UnknownMethod))
}

fn string_method(
    s: &str,
    method: &str,
    args: &[JValue],
) -> std::result::Result<JValue, minijinja::Error> {
    let strip_set = |chars: Option<String>| {
        move |c: char| {
            chars
                .as_deref()
                .map_or(c.is_whitespace(), |set| set.contains(c))
        }
    };
    Ok(match method {
        "strip" => {
            let (chars,): (Option<String>,) = from_args(args)?;
            JValue::from(s.trim_matches(strip_set(chars)))
        }
        "lstrip" => {
            let (chars,): (Option<String>,) = from_args(args)?;
            JValue::from(s.trim_start_matches(strip_set(chars)))
        }
        "rstrip" => {
            let (chars,): (Option<String>,) = from_args(args)?;
            JValue::from(s.trim_end_matches(strip_set(chars)))
        }
        "startswith" => {
            let (prefix,): (String,) = from_args(args)?;
            JValue::from(s.starts_with(&prefix))
        }
        "endswith" => {
            let (suffix,): (String,) = from_args(args)?;
            JValue::from(s.ends_with(&suffix))
        }
        "upper" => JValue::from(s.to_uppercase()),
        "lower" => JValue::from(s.to_lowercase()),
        "capitalize" => {
            let mut chars = s.chars();
            JValue::from(match chars.next() {
                Some(first) => first
                    .to_uppercase()
                    .chain(chars.flat_map(char::to_lowercase))
                    .collect::<String>(),
                None => String::new(),
            })
        }
        "replace" => {
            let (from, to): (String, String) = from_args(args)?;
            JValue::from(s.replace(&from, &to))
        }
        "split" => {
            let (sep, rest): (Option<String>, Rest<JValue>) = from_args(args)?;
            if !rest.is_empty() {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "split: maxsplit is not supported",
                ));
            }
            let parts: Vec<JValue> = match sep {
                Some(sep) if !sep.is_empty() => s.split(sep.as_str()).map(JValue::from).collect(),
                Some(_) => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "split: empty separator",
                    ))
                }
                None => s.split_whitespace().map(JValue::from).collect(),
            };
            JValue::from(parts)
        }
        "join" => {
            let (items,): (JValue,) = from_args(args)?;
            let parts: Vec<String> = items.try_iter()?.map(|v| v.to_string()).collect();
            JValue::from(parts.join(s))
        }
        _ => return Err(minijinja::Error::from(ErrorKind::UnknownMethod)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_python_methods_and_loop_controls() {
        // trim_blocks: the newline right after `{% endif %}` / `{% endfor %}` is dropped.
        let source = "{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}\
            <|{{ m['role'].upper() }}|>{{ m.content.strip() }}{% if m.content.startswith(' x') %}!{% endif %}\n\
            {% endfor %}{% if add_generation_prompt %}{{ bos_token }}go{{ eos_token }}{% endif %}";
        let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
        let msgs = [
            ChatMessage::new("user", " x y "),
            ChatMessage::new("skip", "no"),
            ChatMessage::new("assistant", "hi"),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|USER|>x y!<|ASSISTANT|>hi<s>go</s>"
        );
        assert_eq!(t.render(&msgs[2..], false).unwrap(), "<|ASSISTANT|>hi");
    }

    #[test]
    fn raise_exception_and_bad_templates_are_errors() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        let err = t
            .render(&[ChatMessage::user("a")], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("roles must alternate"), "{err}");
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }

    #[test]
    fn trims_blocks_like_hugging_face() {
        let t = ChatTemplate::new("{% for m in messages %}\n  {% if true %}\n{{ m.content }}\n  {% endif %}\n{% endfor %}\n", "", "").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::user("a"), ChatMessage::user("b")], false)
                .unwrap(),
            "a\nb\n"
        );
    }

    #[test]
    fn dates_and_dict_methods() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let today = strftime_now("%d %B %Y".into());
        assert_eq!(today.split(' ').count(), 3);
        let t = ChatTemplate::new(
            "{% set d = {'a': 1} %}{{ d.get('a') }}{{ d.get('b', 7) }}{% for k, v in d.items() %}{{ k }}={{ v }}{% endfor %}{{ ','.join(['x', 'y']) }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "17a=1x,y");
    }
}
