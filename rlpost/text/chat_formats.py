"""Chat formats: how a model file's chat template lays turns out, as token ids.

  gemma   <start_of_turn>{role}\\n{content}<end_of_turn>\\n ... <start_of_turn>model\\n
          (no system role: the system text and "\\n\\n" open the first user content)
  chatml  <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n
          (SmolLM2, Qwen; a system turn, and the template's default system text when
          the conversation has none)
  llama3  <|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|> ...
          <|start_header_id|>assistant<|end_header_id|>\\n\\n

Only the control tokens are ids here; every text segment between two control tokens
(role name and content together) is encoded as one piece of plain text
(`parse_special=False`), as a chat template's rendering is tokenized, so control-token
text inside contents stays text. BOS opens a prompt when the tokenizer uses one
(`Tokenizer.uses_bos`).
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


def opening_turns(tokenizer, user: str, system: str | None) -> list[int]:
  """BOS, the system turn (or the template's default one), and the first user turn."""
  fmt = get(tokenizer.chat)
  ids = start(tokenizer)
  if system is None:
    system = tokenizer.default_system
  if system is not None and fmt.system_turn:
    ids += turn(tokenizer, "system", system)
  elif system is not None:
    user = f"{system}\n\n{user}"
  return ids + turn(tokenizer, "user", user)


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
