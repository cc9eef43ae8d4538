"""Chat formats: how a model file's chat template lays turns out, as token ids.

  gemma   <start_of_turn>{role}\\n{content}<end_of_turn>\\n ... <start_of_turn>model\\n
          (no system role: the system text and "\\n\\n" open the first user content)
  chatml  <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n
          (SmolLM2, Qwen; a system turn, and the template's default system text when
          the conversation has none)
  llama3  <|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|> ...
          <|start_header_id|>assistant<|end_header_id|>\\n\\n
          (Llama 3.1+: a system turn always, opened by the template's knowledge and
          date lines, `system_preamble`)

Only the control tokens are ids here; every text segment between two control tokens
(role name and content together) is encoded as one piece of plain text
(`parse_special=False`), as a chat template's rendering is tokenized, so control-token
text inside contents stays text. BOS opens a prompt when the tokenizer uses one
(`Tokenizer.uses_bos`). Contents are written verbatim: Gemma's and Llama 3's templates
strip each one (Jinja `trim`), so a content with leading or trailing whitespace renders
differently there.
"""

import dataclasses
import re

NAMES = ("gemma", "chatml", "llama3")


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """One chat layout. open_text/close_text: the control tokens around a turn; header_close:
  the control token after the role (Llama 3), or "" (the role ends with "\\n" instead);
  after_close: text after a turn's close token; assistant: the assistant's role name;
  system_turn: the format has a system role (else the system text joins the first user
  turn)."""

  name: str
  open_text: str
  close_text: str
  header_close: str
  after_close: str
  assistant: str
  system_turn: bool


FORMATS = {
  "gemma": ChatFormat("gemma", "<start_of_turn>", "<end_of_turn>", "", "\n", "model", False),
  "chatml": ChatFormat("chatml", "<|im_start|>", "<|im_end|>", "", "\n", "assistant", True),
  "llama3": ChatFormat(
    "llama3", "<|start_header_id|>", "<|eot_id|>", "<|end_header_id|>", "", "assistant", True
  ),
}


def get(name: str) -> ChatFormat:
  if name not in FORMATS:
    raise ValueError(f"chat format {name!r}: use one of {NAMES}")
  return FORMATS[name]


def detect(template: str) -> str | None:
  """The format a Jinja chat template writes (by its control tokens), or None."""
  for name in ("llama3", "chatml", "gemma"):
    fmt = FORMATS[name]
    if fmt.open_text in template and fmt.close_text in template:
      return name
  return None


def default_system(template: str, name: str) -> str | None:
  """The system text a ChatML template writes when the conversation has none (SmolLM2's
  "You are a helpful AI assistant named SmolLM, ...", Qwen2.5's "You are Qwen, ..."), or
  None: the one system turn the template holds as a literal string,
  `'<|im_start|>system\\n...<|im_end|>'` (a turn built from the messages, as Qwen3's,
  is no default)."""
  if name != "chatml":
    return None
  # The newline after "system" is a newline or, in a template read from JSON, Jinja's "\n".
  found = re.findall(r"""['"]<\|im_start\|>system(?:\n|\\n)([^'"{}]*?)<\|im_end\|>""", template)
  return found[0] if len(set(found)) == 1 else None


def system_preamble(template: str, name: str) -> str:
  """The text a Llama 3.1+ template writes at the top of every system turn, written even
  when the conversation has no system message: "Cutting Knowledge Date: {date}\\nToday
  Date: {today}\\n\\n", with the template's own literal fallback for today's date
  (`set date_string = "26 Jul 2024"`), not the calendar's, so that prompts do not change
  from day to day; "" for any other template."""
  if name != "llama3" or "Today Date: " not in template:
    return ""
  knowledge = set(re.findall(r"Cutting Knowledge Date: ([^'\"\\{}]+)", template))
  today = set(re.findall(r"""set date_string = ['"]([^'"]+)['"]""", template))
  if len(knowledge) != 1 or len(today) != 1:
    return ""
  return f"Cutting Knowledge Date: {knowledge.pop()}\nToday Date: {today.pop()}\n\n"


def _text(tokenizer, text: str) -> list[int]:
  return list(tokenizer.encode(text, add_bos=False, parse_special=False)) if text else []


def _id(tokenizer, text: str) -> int:
  if text not in tokenizer.special_tokens:
    raise ValueError(
      f"the tokenizer has no {text!r} control token, which its chat format {tokenizer.chat!r} needs"
    )
  return tokenizer.special_tokens[text]


def turn(tokenizer, role: str, content: str, close: bool = True) -> list[int]:
  """One turn: opening, role, content and (when `close`) its close and what follows it."""
  fmt = get(tokenizer.chat)
  ids = [_id(tokenizer, fmt.open_text)]
  if fmt.header_close:
    ids += _text(tokenizer, role) + [_id(tokenizer, fmt.header_close)]
    ids += _text(tokenizer, f"\n\n{content}")
  else:
    ids += _text(tokenizer, f"{role}\n{content}")
  return ids + (closing(tokenizer) if close else [])


def closing(tokenizer) -> list[int]:
  """A turn's close token and the text after it."""
  fmt = get(tokenizer.chat)
  return [_id(tokenizer, fmt.close_text)] + _text(tokenizer, fmt.after_close)


def generation_prompt(tokenizer) -> list[int]:
  """The assistant's opening, where the model writes."""
  return turn(tokenizer, get(tokenizer.chat).assistant, "", close=False)


def start(tokenizer) -> list[int]:
  """What opens a conversation: BOS when the tokenizer uses one."""
  return [tokenizer.bos_id] if tokenizer.uses_bos else []


def _opening(
  fmt: ChatFormat, user: str, system: str | None, default_system: str | None, preamble: str
) -> list[tuple[str, str]]:
  """(role, content) of a conversation's opening turns: the system turn where the format
  has one and there is a system text (`system` None: `default_system`) or a preamble, then
  the user turn (opened by the system text where the format has no system role)."""
  system = default_system if system is None else system
  if fmt.system_turn and (system is not None or preamble):
    return [("system", preamble + (system or "")), ("user", user)]
  return [("user", user if system is None else f"{system}\n\n{user}")]


def opening_turns(tokenizer, user: str, system: str | None) -> list[int]:
  """BOS, the system turn (or the template's default one, after the template's preamble),
  and the first user turn."""
  fmt = get(tokenizer.chat)
  turns = _opening(fmt, user, system, tokenizer.default_system, tokenizer.system_preamble)
  return start(tokenizer) + [i for role, text in turns for i in turn(tokenizer, role, text)]


def _turn_text(fmt: ChatFormat, role: str, content: str, close: bool = True) -> str:
  head = f"{role}{fmt.header_close}\n\n" if fmt.header_close else f"{role}\n"
  return fmt.open_text + head + content + (fmt.close_text + fmt.after_close if close else "")


def prompt_text(
  name: str,
  user: str,
  system: str | None,
  default_system: str | None = None,
  system_preamble: str = "",
) -> str:
  """The first prompt as text, without BOS: what `opening_turns` and `generation_prompt`
  lay out for a tokenizer of chat format `name` (its `default_system`, `system_preamble`),
  control tokens written as their text. The prompt reward functions see (Gemma:
  `<start_of_turn>user\\n...<start_of_turn>model\\n`)."""
  fmt = get(name)
  turns = _opening(fmt, user, system, default_system, system_preamble)
  return "".join(_turn_text(fmt, r, t) for r, t in turns) + _turn_text(
    fmt, fmt.assistant, "", False
  )


def conversation_ids(tokenizer, messages, add_generation_prompt: bool = True) -> list[int]:
  """A whole conversation (an optional first system message, then user / assistant turns
  starting with user) as the model file's chat template lays it out, contents as plain
  text; with `add_generation_prompt`, the assistant's opening after it."""
  fmt = get(tokenizer.chat)
  system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
  rest = list(messages[1:] if system is not None else messages)
  if not rest or rest[0]["role"] != "user":
    raise ValueError("a conversation starts with a user message (after an optional system one)")
  ids = opening_turns(tokenizer, rest[0]["content"], system)
  for m in rest[1:]:
    ids += turn(tokenizer, fmt.assistant if m["role"] == "assistant" else m["role"], m["content"])
  return ids + (generation_prompt(tokenizer) if add_generation_prompt else [])
