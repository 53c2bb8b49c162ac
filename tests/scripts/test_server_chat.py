#!/usr/bin/env python3
# test_server_chat.py - chat templates on the demo model's byte vocabulary (issue 28): the
# chat_template setting (built-in names, a template file, the refusal of an unknown name) for
# the server's CHAT, `llsrv generate --chat` and `llsrv train`; and message contents that stay
# text: "</s>" is the demo vocabulary's EOS (a control token) and llama2's end of a turn, so a
# user message "</s>" must count as its four bytes, not as the template's marker. Qwen3's
# template (issue 32): recognised from its text, CHAT enable_thinking=0's empty think block,
# an earlier assistant turn's reasoning left out of the prompt.
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from llsrv_client import BIN, Checker, Server, parse_line  # noqa: E402

check = Checker()
tmp = tempfile.mkdtemp(prefix="llsrv-chat-")
os.chmod(tmp, 0o700)
NAMES = "chatml, llama2, llama3, zephyr, gemma, phi3, qwen3"


def chat(c, content, extra=""):
    """prompt_tokens of a one-message CHAT (the END line), or the ERR line."""
    line = 'CHAT max_tokens=1 temperature=0 %s:[{"role":"user","content":"%s"}]' % (extra, content)
    text, end, lines = c.generate(line)
    if text is None:
        return end["line"]
    return int(end.get("prompt_tokens", -1))


# ---- no template: the error says how to set one ----
srv = Server(tmp, ["--threads", "2", "--ctx", "256", "--parallel", "2"], name="plain")
c = srv.conn()
r = chat(c, "hi")
check(isinstance(r, str) and r.startswith("ERR") and "unsupported" in r and "chat_template" in r,
      "CHAT without a template names the setting: %r" % r)
k, _, kv, _ = parse_line(c.request("INFO"))
check(kv.get("chat_template") == "none", "INFO chat_template=none: %r" % kv.get("chat_template"))
c.close()
check(srv.stop() == 0, "the server exits 0 (under ASan: no leak)")
demo = os.path.join(tmp, "state", "models", "demo.ckpt")
check(os.path.exists(demo), "the demo model is under the state dir")

# ---- an unknown name: refused at start, the message lists the known ones ----
p = subprocess.run([BIN, "--listen", "127.0.0.1:0", "--socket", os.path.join(tmp, "x.sock"), "--state-dir",
                    os.path.join(tmp, "state"), "--chat-template", "chatml3"], capture_output=True, text=True, timeout=120)
check(p.returncode == 2 and "chatml3" in p.stderr and NAMES in p.stderr, "unknown --chat-template: %d %r" % (p.returncode, p.stderr))

p = subprocess.run([BIN, "--check-config", "--chat-template", "gemma2"], capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "gemma2" in p.stderr and NAMES in p.stderr, "--check-config refuses an unknown template: %r" % p.stderr)
p = subprocess.run([BIN, "--check-config", "--chat-template", "gemma"], capture_output=True, text=True, timeout=60)
check(p.returncode == 0 and "chat_template: \"gemma\"" in p.stdout, "--check-config shows chat_template: %r" % p.stdout[:200])

# ---- llama2 on the byte vocabulary: contents are text ----
srv = Server(tmp, ["--threads", "2", "--ctx", "256", "--parallel", "2", "--chat-template", "llama2"], name="llama2")
c = srv.conn()
k, _, kv, _ = parse_line(c.request("INFO"))
check(kv.get("chat_template") == "llama2", "INFO chat_template=llama2: %r" % kv.get("chat_template"))
p_eos, p_abcd = chat(c, "</s>"), chat(c, "abcd")
# BOS + "[INST] " + 4 bytes + " [/INST]": 1 + 7 + 4 + 8
check(p_abcd == 20 and p_eos == p_abcd, "CHAT '</s>' counts its 4 bytes: %r vs 'abcd' %r" % (p_eos, p_abcd))
check(chat(c, "</s>", "special=0 ") == p_abcd, "special=0 is the default for CHAT")
# special=1: the client's own markup, parsed (a trusted client's opt-in)
check(chat(c, "</s>", "special=1 ") == p_abcd - 3, "CHAT special=1 parses the contents' markers")
c.close()
check(srv.stop() == 0, "the llama2 server exits 0")

# ---- a template file (Jinja text of a known format) ----
jinja = os.path.join(tmp, "zephyr.jinja")
with open(jinja, "w") as f:
    f.write("{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}<|user|>")
srv = Server(tmp, ["--threads", "2", "--ctx", "256", "--parallel", "2", "--chat-template", jinja], name="file")
c = srv.conn()
k, _, kv, _ = parse_line(c.request("INFO"))
check(kv.get("chat_template") == "zephyr", "a template file: INFO chat_template=zephyr: %r" % kv.get("chat_template"))
check(chat(c, "</s>") == chat(c, "abcd"), "zephyr file: '</s>' in a message is text")
c.close()
check(srv.stop() == 0, "the template-file server exits 0")

# ---- Qwen3's template (issue 32): recognised from its text, CHAT enable_thinking ----
q3 = os.path.join(tmp, "qwen3.jinja")
with open(q3, "w") as f:  # the lines of Qwen3's template that llsrv recognises it by
    f.write("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}"
            "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
srv = Server(tmp, ["--threads", "2", "--ctx", "256", "--parallel", "2", "--chat-template", q3], name="qwen3")
c = srv.conn()
k, _, kv, _ = parse_line(c.request("INFO"))
check(kv.get("chat_template") == "qwen3", "Qwen3's template file: INFO chat_template=qwen3: %r" % kv.get("chat_template"))
p_on, p_off = chat(c, "abcd"), chat(c, "abcd", "enable_thinking=0 ")
check(chat(c, "abcd", "enable_thinking=1 ") == p_on and p_off - p_on == len("<think>\n\n</think>\n\n"),
      "CHAT enable_thinking=0 adds the empty think block's 19 bytes: %r vs %r" % (p_off, p_on))
hist = '[{"role":"user","content":"a"},{"role":"assistant","content":"%s"},{"role":"user","content":"b"}]'
n1 = c.generate("CHAT max_tokens=1 :" + hist % "<think>xyz</think>ok")[1].get("prompt_tokens")
n2 = c.generate("CHAT max_tokens=1 :" + hist % "ok")[1].get("prompt_tokens")
check(n1 is not None and n1 == n2, "an earlier turn's reasoning is left out of the prompt: %r vs %r" % (n1, n2))
r = c.request("CHAT enable_thinking=maybe :hi")
check(r.startswith("ERR") and "bad_param" in r and "enable_thinking" in r, "enable_thinking=maybe: %r" % r)
c.close()
check(srv.stop() == 0, "the qwen3 server exits 0")

# ---- llsrv generate --chat-template: the same rendering, the content stays text ----
def gen_ids(prompt, *extra):
    p = subprocess.run([BIN, "generate", "--model", demo, "-t", "2", "--ctx", "128", "-n", "1", "--temp", "0", "--dump-logits", "1",
                        "-p", prompt] + list(extra), capture_output=True, text=True, timeout=120)
    for l in p.stderr.splitlines():
        if l.startswith("prompt_ids:"):
            return p.returncode, [int(x) for x in l.split()[1:]]
    return p.returncode, p.stderr


rc, ids = gen_ids("</s>", "--chat-template", "llama2")
check(rc == 0 and isinstance(ids, list) and len(ids) == 20 and 2 not in ids, "generate --chat-template llama2 -p '</s>': %d %r" % (rc, ids))
rc, r = gen_ids("x", "--chat")
check(rc == 1 and isinstance(r, str) and "chat_template" in r, "generate --chat without a template names the setting: %d %r" % (rc, r))
rc, r = gen_ids("x", "--chat-template", "nope")
check(rc == 1 and isinstance(r, str) and NAMES in r, "generate --chat-template nope lists the names: %d %r" % (rc, r))

# ---- llsrv train --chat-template: chat records of the demo model ----
data = os.path.join(tmp, "chat.jsonl")
with open(data, "w") as f:
    for i in range(40):
        f.write('{"messages":[{"role":"user","content":"question %d </s>"},{"role":"assistant","content":"answer %d"}]}\n' % (i, i))


def train(*extra):
    return subprocess.run([BIN, "train", "--model", demo, "--data", data, "--mode", "full", "--seq-len", "32", "--dry-run", "-t", "2"]
                          + list(extra), capture_output=True, text=True, timeout=300)


p = train()
check(p.returncode == 1 and "chat template" in p.stderr and "--chat-template" in p.stderr,
      "train: chat records without a template refused, naming the option: %r" % p.stderr[-300:])
p = train("--chat-template", "llama2")
check(p.returncode == 0, "train --chat-template llama2 --dry-run: %d %r" % (p.returncode, p.stderr[-300:]))
p = train("--chat-template", "llama9")
check(p.returncode == 1 and NAMES in p.stderr, "train --chat-template llama9 lists the names: %r" % p.stderr[-300:])

sys.exit(check.summary())
