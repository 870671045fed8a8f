"""The served model's prompt format as an Ollama Go template, for /api/show.

The daemon renders chats with the GGUF's own Jinja template; clients never
execute this one, they read it: a `.Suffix` branch says the model fills in the
middle (Continue and others look for it), `.Tools` that it calls tools. ChatML
models (Qwen) get the template Ollama's own Modelfiles use; others a plain one
that says the same about FIM and tools.
"""

from __future__ import annotations

from collections.abc import Sequence

from localspec.models.gguf_info import GGUFInfo

# Ollama's qwen2.5 Modelfile, the system turn: the tool instructions appear only with tools.
_CHATML_SYSTEM = """\
{{- if or .System .Tools }}<|im_start|>system
{{- if .System }}
{{ .System }}
{{- end }}
{{- if .Tools }}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{{- range .Tools }}
{"type": "function", "function": {{ .Function }}}
{{- end }}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
{{- end }}<|im_end|>
{{ end }}"""
_CHATML_SYSTEM_NO_TOOLS = """\
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}"""
_CHATML_TURNS = """\
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ .Content }}{{ if not $last }}<|im_end|>
{{ end }}
{{- else if eq .Role "tool" }}<|im_start|>user
<tool_response>
{{ .Content }}
</tool_response><|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ end }}
{{- end }}"""
_CHATML_PROMPT = """\
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ end }}{{ .Response }}{{ if .Response }}<|im_end|>{{ end }}"""
# Models without ChatML: role-prefixed turns, the daemon's own fallback format.
_PLAIN_TURNS = """\
{{- if .System }}System: {{ .System }}
{{ end }}
{{- range .Messages }}{{ .Role }}: {{ .Content }}
{{ end }}Assistant:"""
_PLAIN_PROMPT = """\
{{- if .System }}System: {{ .System }}
{{ end }}User: {{ .Prompt }}
Assistant:{{ end }}{{ .Response }}"""


def fim_texts(info: GGUFInfo, tokens: Sequence[str]) -> tuple[str, str, str] | None:
    """The FIM markers' texts (`<|fim_prefix|>` ...), or None without FIM."""
    ids = (info.fim_prefix_id, info.fim_suffix_id, info.fim_middle_id)
    if any(i is None or not 0 <= i < len(tokens) for i in ids):
        return None
    pre, suf, mid = (tokens[i] for i in ids if i is not None)
    return pre, suf, mid


def ollama_template(info: GGUFInfo, tokens: Sequence[str], capabilities: Sequence[str]) -> str:
    """The Go template Ollama would show for this model; `.Tools` only with the `tools` capability."""
    fim = fim_texts(info, tokens)
    head = ""
    if fim is not None and "insert" in capabilities:
        pre, suf, mid = fim
        head = f"{{{{- if .Suffix }}}}{pre}{{{{ .Prompt }}}}{suf}{{{{ .Suffix }}}}{mid}\n{{{{- else "
    else:
        head = "{{- "
    if "<|im_start|>" in (info.chat_template or ""):
        system = _CHATML_SYSTEM if "tools" in capabilities else _CHATML_SYSTEM_NO_TOOLS
        return f"{head}if .Messages }}}}\n{system}\n{_CHATML_TURNS}\n{{{{- else }}}}\n{_CHATML_PROMPT}"
    return f"{head}if .Messages }}}}\n{_PLAIN_TURNS}\n{{{{- else }}}}\n{_PLAIN_PROMPT}"
