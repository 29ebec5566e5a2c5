#!/usr/bin/env python3
"""Write tests/fixtures/chat_templates.json, the fixture of tests/test_jinja.c:
the chat templates of six model families, conversations rendered with them by
transformers' apply_chat_template(tokenize=False), where each assistant message's
content landed in the text, and for two templates the token ids and trained flags
of the rendering with the small Llama 3 and Qwen2 tokenizers of
tests/fixtures/tok_*.json (tools/gen_tokenizer_fixture.py).

The templates are the "chat_template" strings of the tokenizer_config.json files
published on the Hugging Face Hub, copied here from their published text (the
machine that wrote the fixture could not reach the Hub; the copies were checked
against vendored copies of the same files in public repositories):

  llama3.1   meta-llama/Llama-3.1-8B-Instruct
  llama3.2   meta-llama/Llama-3.2-1B-Instruct (also 3B; strftime_now for the date)
  qwen2      Qwen/Qwen2-0.5B-Instruct (and the other Qwen2-Instruct sizes)
  qwen2.5    Qwen/Qwen2.5-0.5B-Instruct (and the other Qwen2.5-Instruct sizes)
  mistral    mistralai/Mistral-7B-Instruct-v0.3
  smollm2    HuggingFaceTB/SmolLM2-1.7B-Instruct (also 135M and 360M)
  tinyllama  TinyLlama/TinyLlama-1.1B-Chat-v1.0

With network access to the Hub, --hub reads them from there instead (and fails
if a published template changed, so the copies here stay honest).

The expected spans are found independently of fsdp's rule: each assistant
content (or, when the template trims it, its stripped text) is searched for in
the rendered text after the previous one. strftime_now is pinned to DATE by
replacing the clock transformers reads. Needs transformers, jinja2 and
tokenizers (PyPI). Run from the repository root:

    python3 tools/gen_chat_template_fixture.py [--hub]
"""
import datetime as _dt
import json
import sys

import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils

OUT = "tests/fixtures/chat_templates.json"
DATE = (2024, 9, 14)

LLAMA31 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

LLAMA32 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

MISTRAL = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
           "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
           "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")

TINYLLAMA = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

# name, Hub repository, template, bos, eos, special tokens the tokenizer has
TEMPLATES = [
    ("llama3.1", "meta-llama/Llama-3.1-8B-Instruct", LLAMA31, "<|begin_of_text|>", "<|eot_id|>",
     ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
      "<|eom_id|>", "<|python_tag|>"]),
    ("llama3.2", "meta-llama/Llama-3.2-1B-Instruct", LLAMA32, "<|begin_of_text|>", "<|eot_id|>",
     ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
    ("qwen2", "Qwen/Qwen2-0.5B-Instruct", QWEN2, None, "<|im_end|>",
     ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    ("qwen2.5", "Qwen/Qwen2.5-0.5B-Instruct", QWEN25, None, "<|im_end|>",
     ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    ("mistral", "mistralai/Mistral-7B-Instruct-v0.3", MISTRAL, "<s>", "</s>",
     ["<s>", "</s>", "[INST]", "[/INST]"]),
    ("smollm2", "HuggingFaceTB/SmolLM2-1.7B-Instruct", SMOLLM2, "<|im_start|>", "<|im_end|>",
     ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    ("tinyllama", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", TINYLLAMA, "<s>", "</s>",
     ["<s>", "</s>"]),
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is 25 plus 49?"},
     {"role": "assistant", "content": "25 plus 49 is 74."}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Name a prime number above ten."},
     {"role": "assistant", "content": "Eleven is a prime number."}],
    [{"role": "system", "content": "Be terse."},
     {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "Paris."},
     {"role": "user", "content": "And of Japan?"},
     {"role": "assistant", "content": "Tokyo, since 1868."}],
    [{"role": "user", "content": "  Translate \u00abthank you\u00bb to Japanese, please.\n"},
     {"role": "assistant", "content": "\n\u3042\u308a\u304c\u3068\u3046 \U0001F64F (arigat\u014d)  "}],
    [{"role": "user", "content": "Is <|eot_id|> or <|im_end|> or </s> or [INST] special here?"},
     {"role": "assistant", "content": "No: <|start_header_id|>assistant and <|im_start|> stay text."}],
    [{"role": "system", "content": "You are a calculator."},
     {"role": "user", "content": "7 times 6?"}],
    [{"role": "user", "content": "First question."},
     {"role": "user", "content": "Second question, no answer between."},
     {"role": "assistant", "content": "One answer for both."}],
    [{"role": "user", "content": "Say nothing but the word of agreement."},
     {"role": "assistant", "content": "yes"},
     {"role": "user", "content": "Again, with a tab\tand a newline\nplease."},
     {"role": "assistant", "content": "yes\tyes\nyes"}],
]

# Small templates for the parts of the language the model templates above touch lightly
# or not at all, rendered with conversation 2 (system, user, assistant, user, assistant).
SNIPPETS = [
    "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/"
    "{{ loop.revindex0 }}/{{ loop.length }}{% if loop.first %}F{% endif %}"
    "{% if loop.last %}L{% endif %} {% endfor %}",
    "{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}{% endfor %}{{ x }}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages if m.role != 'system' %}"
    "{% set ns.n = ns.n + loop.length %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}"
    "{{ ns.n }} {{ ns.s }}",
    "{{ messages[-1]['content'] }}|{{ messages[1:3] | map(attribute='role') | join(',') }}|"
    "{{ (messages | last).role }}|{{ messages[::-1][0].role }}|{{ messages[::2] | length }}",
    "{{ 'abc'[1:] }}{{ 'abcdef'[::-2] }}{{ 'h\u00e9llo'[1] }}{{ '\u3042\u3044\u3046'[-1:] }}",
    "  {% if true %}\n    yes\n  {% endif %}\n  {%- if false %}no{% else %} else {% endif -%}\n"
    "  {#- a comment -#}  \n{{- ' x ' -}}  \n  {%+ if true %}plus{% endif +%}\ntail\n",
    "{% if true %}\n  a\n{% endif %}\n  {# c #}\n b {{ 'v' }}  {% if true %}x{% endif %}\n\n",
    "{{ '  padded\\t' | trim }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|"
    "{{ 'xxhixx'.strip('x') }}|{{ 'Hello'.upper() }}{{ 'Hello'.lower() }}|"
    "{{ 'ab'.startswith('a') }}{{ 'ab'.endswith(('x', 'b')) }}|{{ 'aXbX'.replace('X', '-') }}",
    "{{ {'b': 1, 'a': [1, 'x', none, true]} | tojson }}|{{ {'b': 1, 'a': 'q\\\"\\n\u00e9'} | "
    "tojson(indent=2) }}|{{ [] | tojson }}|{{ {'z': {}, 'a': 2} | tojson(sort_keys=true) }}",
    "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 * 'ab' }} {{ [1] + [2] }} "
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 3 > 2 > 1 }} {{ 1 in [1, 2] }} {{ 'b' not in 'abc' }}",
    "{{ none }} {{ true }} {{ [1, 'a', none] }} {{ {'k': 'v'} }} {{ \"it's\" }} {{ [\"it's\"] }}",
    "{{ x is defined }} {{ messages is iterable }} {{ 'a' is string }} {{ 3 is odd }} "
    "{{ 4 is divisibleby 2 }} {{ none is none }} {{ {} is mapping }} {{ 1 is number }} "
    "{{ 'x' is not string }} {{ 2 is eq 2 }} {{ messages[0] is mapping }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}"
    "|{{ [1, 2, 3, 4] | reject('odd') | list }}|{{ [3, 1, 3] | unique | list }}|"
    "{{ [1, 2] | first }}{{ 'xyz' | last }}|{{ 'abc' | reverse }}|{{ undefined_name | default('d') }}"
    "|{{ '' | default('e', true) }}|{{ 'hello world' | title }}{{ 'hELLO' | capitalize }}",
    "{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}={{ v }};{% endfor %}"
    "{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}"
    "{% for k, v in {'p': 1}.items() %}{{ k }}{{ v }}{% endfor %}"
    "{% for c in 'ab' %}[{{ c }}]{% else %}empty{% endfor %}{% for c in [] %}x{% else %}none{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}"
    "{% endif %}{{ i }}{% endfor %}|{{ range(3) | list }}{{ range(1, 10, 3) | list }}",
    "{{ 'a' if messages | length > 3 else 'b' }}{{ 'c' if false }}{{ ('x', 'y')[1] }}"
    "{{ {'a': {'b': 'deep'}}['a'].b }}{{ dict(k=1).k }}{{ [1, 2, 3] | join('-') }}{{ 42 | string }}"
    "{{ '12' | int + 1 }}{{ (messages | length) is even }}",
    "{%- for message in messages -%}{%- if message.role == 'user' -%}{{- 'U: ' + message.content "
    "| trim -}}{%- elif message.role == 'assistant' -%}{{ '\\nA: ' + message['content'] }}"
    "{%- endif -%}\n{%- endfor -%}",
    "{{ raise_exception('refused: ' + messages[0].role) }}",
]

# (template, tokenizer fixture) pairs whose token ids and trained flags are checked
TOKENIZED = [("llama3.1", "tok_llama3.json"), ("llama3.2", "tok_llama3.json"),
             ("qwen2.5", "tok_qwen2.json"), ("smollm2", "tok_qwen2.json")]


class FixedClock(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(*DATE, 12, 0, 0)


def hub_template(repo):
    from huggingface_hub import hf_hub_download
    with open(hf_hub_download(repo, "tokenizer_config.json")) as f:
        return json.load(f)["chat_template"]


def tokenizer(template, bos, eos, specials):
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=template,
                                  bos_token=bos, eos_token=eos)
    return tok


def byte_offset(text, i):
    return len(text[:i].encode("utf-8"))


def assistant_spans(text, conv, template):
    """Where each assistant content landed: [begin, end) in characters."""
    spans, at = [], 0
    for m in conv:
        if m["role"] != "assistant":
            continue
        for cand in (m["content"], m["content"].strip()):
            k = text.find(cand, at)
            if k >= 0 and cand:
                spans.append((k, k + len(cand)))
                at = k + len(cand)
                break
        else:
            raise SystemExit(f"{template}: assistant content {m['content']!r} not in {text!r}")
    return spans


def trained_flags(text, spans, specials, offsets):
    """The rule of src/data/chat.c: a token is trained when it overlaps an assistant
    content, or the stretch from its end through the first special token after it when
    only whitespace comes between."""
    ranges = []
    for b, e in spans:
        k = e
        while k < len(text) and text[k].isspace():
            k += 1
        for s in specials:
            if text.startswith(s, k):
                e = k + len(s)
                break
        ranges.append((b, e))
    return [int(any(tb < e and te > b for b, e in ranges)) for tb, te in offsets]


def main():
    use_hub = "--hub" in sys.argv[1:]
    chat_template_utils.datetime = FixedClock
    out = {"generated_by": "tools/gen_chat_template_fixture.py",
           "transformers": transformers.__version__, "date": list(DATE), "templates": [],
           "conversations": CONVERSATIONS, "cases": []}
    for name, repo, template, bos, eos, specials in TEMPLATES:
        if use_hub:
            published = hub_template(repo)
            if published != template:
                raise SystemExit(f"{name}: the template on the Hub ({repo}) differs from the "
                                 "copy in this script; update the copy")
        out["templates"].append({"name": name, "source": repo, "template": template,
                                 "bos_token": bos, "eos_token": eos, "specials": specials})
        tok = tokenizer(template, bos, eos, specials)
        fixtures = {t: f for t, f in TOKENIZED if t == name}
        for ci, conv in enumerate(CONVERSATIONS):
            for gen in (False, True):
                case = {"template": name, "conversation": ci, "add_generation_prompt": gen}
                try:
                    text = tok.apply_chat_template(conv, tokenize=False,
                                                   add_generation_prompt=gen)
                except Exception as e:  # the template's raise_exception
                    case["error"] = str(e)
                    out["cases"].append(case)
                    continue
                case["text"] = text
                spans = assistant_spans(text, conv, name)
                case["assistant_spans"] = [[byte_offset(text, b), byte_offset(text, e)]
                                           for b, e in spans]
                special_in_text = any(s in m["content"] for m in conv
                                      for t in TEMPLATES for s in t[5])
                if name in fixtures and not special_in_text:
                    ref = Tokenizer.from_file("tests/fixtures/" + fixtures[name])
                    enc = ref.encode(text, add_special_tokens=False)
                    case["tokenizer"] = fixtures[name]
                    case["ids"] = enc.ids
                    case["trained"] = trained_flags(text, spans, specials, enc.offsets)
                out["cases"].append(case)
    out["snippets"] = []
    plain = tokenizer(None, "<s>", "</s>", [])
    for snippet in SNIPPETS:
        entry = {"template": snippet, "conversation": 2}
        try:
            entry["text"] = plain.apply_chat_template(CONVERSATIONS[2], chat_template=snippet,
                                                      tokenize=False)
        except Exception as e:
            entry["error"] = str(e)
        out["snippets"].append(entry)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(out['templates'])} templates, {len(out['cases'])} cases")


if __name__ == "__main__":
    main()
