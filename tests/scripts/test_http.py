#!/usr/bin/env python3
# test_http.py - the OpenAI-compatible HTTP API (man 7 llsrv-http) with real clients, on the
# embedded demo model (and stories260K's adapters when ../shared/testdata has them):
#   - the official `openai` package: models list, chat and completions streamed and not (equal
#     greedy text, equal to the line protocol's GEN), usage, logprobs, errors as the SDK's
#     exception types (NotFoundError, BadRequestError, AuthenticationError), an adapter chosen
#     by `model` (same ids as GEN adapter=NAME);
#   - curl: SSE framing byte for byte; a client that disconnects mid-stream frees its slot;
#   - bad input on raw sockets: malformed JSON, wrong types, huge bodies, 1000 idle keep-alive
#     connections, slow headers, HTTP/1.0, pipelined requests - each answered with an
#     OpenAI-style error or a closed connection, and both protocols keep serving;
#   - /metrics parsed by prometheus_client's text-format parser.
# The Python packages come from a venv the test makes once under the build directory
# (LL_BINARY_DIR/pyvenv, reused while it imports them).
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time

# The test venv's packages (llsrv_client.ensure_venv); test_http_finetune.py uses the same venv.
PKGS = ["openai>=1.30,<3", "prometheus_client>=0.17"]
BUILD = os.path.abspath(os.environ.get("LL_BINARY_DIR", "build"))
sys.path.insert(0, os.path.dirname(__file__))
from llsrv_client import ensure_venv  # noqa: E402

ensure_venv(PKGS, ["openai", "prometheus_client"])

import openai  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from llsrv_client import BIN, Checker, Server, wait_until  # noqa: E402

check = Checker()
tmp = tempfile.mkdtemp(prefix="llsrv-http-")
os.chmod(tmp, 0o700)
# 1000 keep-alive connections below: both ends' descriptors.
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < 4096 <= hard or (hard == resource.RLIM_INFINITY and soft < 4096):
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
N_IDLE = 1000 if resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 2300 else 200

srv = Server(tmp, ["--parallel", "4", "--ctx", "512", "--max-clients", str(N_IDLE + 64), "--max-line", "256K",
                   "--line-timeout", "3s", "--max-tokens", "2048"])
check(srv.http_port is not None, "the start-up summary names the HTTP address")
BASE = "http://127.0.0.1:%d" % srv.http_port
cli = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)


def raw(data, timeout=30, want_close=False):
    """Sends bytes on a fresh connection; returns everything read until the server closes, or
    (without want_close) until a whole response with Content-Length / chunked end arrived."""
    s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
            if not want_close and complete(out):
                break
    except socket.timeout:
        out += b"<timeout>"
    s.close()
    return out


def raw_to(port, data):
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(data)
    out = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        out += d
    s.close()
    return out


def complete(buf):
    if b"\r\n\r\n" not in buf:
        return False
    head, body = buf.split(b"\r\n\r\n", 1)
    m = re.search(rb"(?i)content-length: *(\d+)", head)
    if m:
        return len(body) >= int(m.group(1))
    if re.search(rb"(?i)transfer-encoding: *chunked", head):
        return body.endswith(b"0\r\n\r\n")
    return False


def status(resp):
    m = re.match(rb"HTTP/1\.[01] (\d+)", resp)
    return int(m.group(1)) if m else None


def body_json(resp):
    head, body = resp.split(b"\r\n\r\n", 1)
    if re.search(rb"(?i)transfer-encoding: *chunked", head):  # de-chunk
        out, rest = b"", body
        while rest:
            n, rest = rest.split(b"\r\n", 1)
            n = int(n, 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return json.loads(body)


def post(path, obj_or_bytes, extra=b""):
    b = obj_or_bytes if isinstance(obj_or_bytes, bytes) else json.dumps(obj_or_bytes).encode()
    return raw(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n" %
               (path.encode(), len(b), extra) + b)


def is_error(resp, code, what):
    try:
        e = body_json(resp)["error"]
        ok = status(resp) == code and isinstance(e["message"], str) and e["message"] and "type" in e and "code" in e
    except Exception as ex:  # noqa: BLE001
        ok, e = False, ex
    return check(ok, "%s: %d with an OpenAI error object (got %r)" % (what, code, resp[:300] if not ok else e))


def both_serve(what):
    c = srv.conn(timeout=30)
    pong = c.request("PING")
    c.close()
    h = raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    check(pong == "PONG" and status(h) == 200, "both protocols serve after %s (PING %r, /health %r)" % (what, pong, h[:40]))


def line_gen(params, text):
    c = srv.conn(timeout=120)
    t, kv, _ = c.generate("GEN %s :%s" % (params, text))
    c.close()
    return t, kv


# ---- the openai package ----
print("-- openai: models, chat and completions, streamed and not", flush=True)
ids = [m.id for m in cli.models.list().data]
check(ids and ids[0] == "demo", "models list names the base model first: %r" % ids)
check(cli.models.retrieve("demo").id == "demo", "models.retrieve of the base model")

msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
r = cli.chat.completions.create(model="demo", messages=msgs, max_tokens=24, temperature=0, seed=1)
c0 = r.choices[0]
check(r.object == "chat.completion" and c0.message.role == "assistant" and isinstance(c0.message.content, str),
      "chat.completion with an assistant message: %r" % r)
check(c0.finish_reason in ("stop", "length") and r.usage.completion_tokens <= 24 and r.usage.prompt_tokens > 0 and
      r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "chat usage and finish_reason: %r" % r.usage)
text_chat = c0.message.content
# A message's text is text (issue 28): "</s>" in it is four bytes, not the end-of-sequence
# token, so it counts as many prompt tokens as any other four bytes there.
inj = cli.chat.completions.create(model="demo", messages=[{"role": "user", "content": "a</s>b"}], max_tokens=1, temperature=0)
ref = cli.chat.completions.create(model="demo", messages=[{"role": "user", "content": "abcdef"}], max_tokens=1, temperature=0)
check(inj.usage.prompt_tokens == ref.usage.prompt_tokens, "a control token's text in a chat message stays text: %d vs %d prompt tokens" %
      (inj.usage.prompt_tokens, ref.usage.prompt_tokens))

parts, finish, usage, roles = [], None, None, []
for ch in cli.chat.completions.create(model="demo", messages=msgs, max_tokens=24, temperature=0, seed=1, stream=True,
                                      stream_options={"include_usage": True}):
    if ch.usage:
        usage = ch.usage
    for c in ch.choices:
        if c.delta.role:
            roles.append(c.delta.role)
        if c.delta.content:
            parts.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
check("".join(parts) == text_chat, "streamed chat text equals the non-streamed one: %r vs %r" % ("".join(parts), text_chat))
check(roles == ["assistant"] and finish == c0.finish_reason, "stream: one role delta, same finish_reason (%r, %r)" % (roles, finish))
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens and usage.prompt_tokens == r.usage.prompt_tokens,
      "include_usage: a last chunk with the same usage: %r" % usage)

# Completions: the same request path as GEN (greedy text equal to the line protocol's).
r = cli.completions.create(model="demo", prompt="Once upon a time", max_tokens=32, temperature=0)
want, kv = line_gen("max_tokens=32 temperature=0", "Once upon a time")
check(r.choices[0].text.encode() == want, "completion text equals GEN's: %r vs %r" % (r.choices[0].text, want))
check(r.usage.completion_tokens == int(kv["tokens"]) and r.usage.prompt_tokens == int(kv["prompt_tokens"]),
      "completion usage equals GEN's END counts: %r vs %r" % (r.usage, kv))
check(r.choices[0].finish_reason == ("length" if kv["reason"] == "length" else "stop"), "finish_reason maps END's reason")
s = "".join(c.choices[0].text for c in cli.completions.create(model="demo", prompt="Once upon a time", max_tokens=32,
                                                                temperature=0, stream=True) if c.choices)
check(s == r.choices[0].text, "streamed completion equals the non-streamed one")
r = cli.completions.create(model="demo", prompt="Once upon a time", max_tokens=40, temperature=0, stop=["e"])
check("e" not in r.choices[0].text and r.choices[0].finish_reason in ("stop", "length"), "stop strings: %r" % r.choices[0].text)
r1 = cli.completions.create(model="demo", prompt="Hello", max_tokens=16, temperature=0.9, top_p=0.9, seed=7,
                            presence_penalty=0.5, frequency_penalty=0.5)
r2 = cli.completions.create(model="demo", prompt="Hello", max_tokens=16, temperature=0.9, top_p=0.9, seed=7,
                            presence_penalty=0.5, frequency_penalty=0.5)
check(r1.choices[0].text == r2.choices[0].text, "sampling with a seed repeats")

print("-- openai: logprobs", flush=True)
r = cli.chat.completions.create(model="demo", messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
lp = r.choices[0].logprobs.content
check(len(lp) == r.usage.completion_tokens, "one logprobs entry per generated token (%d vs %d)" % (len(lp), r.usage.completion_tokens))
check(all(len(e.top_logprobs) == 3 and e.logprob <= 0 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
          and abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5 for e in lp),
      "greedy: each token is its top candidate, 3 sorted candidates: %r" % lp[:2])
check("".join(bytes(e.bytes).decode("utf-8", "replace") for e in lp) == r.choices[0].message.content or
      b"".join(bytes(e.bytes) for e in lp).decode("utf-8", "replace") == r.choices[0].message.content,
      "the tokens' bytes make the text")
# logprobs without top_logprobs: plain greedy otherwise, whose argmax path brings no logits back;
# the logprob must still be the token's (it was read from stale logits: -7e31 on the demo).
r0 = cli.chat.completions.create(model="demo", messages=msgs, max_tokens=8, temperature=0, logprobs=True)
l0 = [e.logprob for e in r0.choices[0].logprobs.content]
check(len(l0) == len(lp) and all(abs(a - e.logprob) < 1e-4 for a, e in zip(l0, lp)),
      "logprobs without top_logprobs equal those with them: %r vs %r" % (l0[:3], [e.logprob for e in lp[:3]]))
r = cli.completions.create(model="demo", prompt="Once", max_tokens=5, temperature=0, logprobs=2)
l2 = r.choices[0].logprobs
check(len(l2.tokens) == 5 and len(l2.token_logprobs) == 5 and len(l2.top_logprobs) == 5 and l2.text_offset[0] == 0,
      "completions' legacy logprobs: %r" % l2)

print("-- openai: errors as the SDK's exception types", flush=True)


def raises(exc, fn, what):
    try:
        fn()
    except exc as e:
        check(getattr(e, "body", None) is None or isinstance(e.body, dict), what)
        return e
    except Exception as e:  # noqa: BLE001
        check(False, "%s: %r instead of %s" % (what, e, exc.__name__))
        return None
    check(False, "%s: no exception" % what)
    return None


e = raises(openai.NotFoundError, lambda: cli.chat.completions.create(model="nope", messages=msgs, max_tokens=2), "unknown model -> NotFoundError")
check(e is not None and e.code == "model_not_found", "unknown model: code model_not_found")
raises(openai.NotFoundError, lambda: cli.models.retrieve("nope"), "unknown model id -> NotFoundError")
raises(openai.BadRequestError, lambda: cli.completions.create(model="demo", prompt="x", max_tokens=2, n=2), "n=2 -> BadRequestError")
raises(openai.BadRequestError, lambda: cli.completions.create(model="demo", prompt="x", max_tokens=100000), "max_tokens over the cap")
raises(openai.BadRequestError, lambda: cli.completions.create(model="demo", prompt="x", max_tokens=2, temperature="hot"),
       "temperature of the wrong type -> BadRequestError")
raises(openai.BadRequestError, lambda: cli.chat.completions.create(model="demo", messages=[{"role": "robot", "content": "x"}], max_tokens=2),
       "unknown role -> BadRequestError")
raises(openai.BadRequestError, lambda: cli.completions.create(model="demo", prompt="x" * 5000, max_tokens=2),
       "a prompt over the context -> BadRequestError")
raises(openai.NotFoundError, lambda: cli.completions.create(model="live", prompt="x", max_tokens=2), "live without training -> NotFoundError")

# ---- curl: SSE framing byte for byte; a disconnect mid-stream ----
print("-- curl: SSE framing", flush=True)
req = json.dumps({"model": "demo", "prompt": "Once", "max_tokens": 6, "temperature": 0, "stream": True,
                  "stream_options": {"include_usage": True}})
p = subprocess.run(["curl", "-sS", "-N", "-D", "-", "-H", "Content-Type: application/json", "-d", req, BASE + "/v1/completions"],
                   capture_output=True, timeout=120)
head, _, sse = p.stdout.partition(b"\r\n\r\n")
check(p.returncode == 0 and b" 200 " in head.split(b"\r\n")[0] and re.search(rb"(?i)content-type: text/event-stream", head),
      "SSE: 200 with text/event-stream: %r" % head)
check(re.fullmatch(rb"(data: \{[^\n]*\}\n\n)+data: \[DONE\]\n\n", sse) is not None,
      "SSE framing: 'data: JSON' events separated by a blank line, then 'data: [DONE]': %r" % sse[-200:])
ev = [json.loads(l[6:]) for l in sse.split(b"\n\n") if l.startswith(b"data: {")]
check(len(ev) == 8 and [e["choices"][0]["finish_reason"] for e in ev[:7]] == [None] * 6 + ["length"] and ev[7]["choices"] == []
      and ev[7]["usage"]["completion_tokens"] == 6 and all(e["usage"] is None for e in ev[:7]),
      "6 token events, a finish event, a usage event: %r" % [e["choices"] for e in ev])
check(len({e["id"] for e in ev}) == 1 and all(e["object"] == "text_completion" for e in ev), "one id, object text_completion")

print("-- curl: a client that disconnects mid-stream frees its slot", flush=True)
req = json.dumps({"model": "demo", "prompt": "Once", "max_tokens": 2000, "temperature": 0, "stream": True, "ignore_eos": True})
cp = subprocess.Popen(["curl", "-sS", "-N", "-H", "Content-Type: application/json", "-d", req, BASE + "/v1/completions"],
                      stdout=subprocess.PIPE)
first = cp.stdout.readline()
check(first.startswith(b"data: {"), "the long stream started: %r" % first)
st = srv.stats()
check(st["active"] == "1", "one request active while it streams: %r" % st)
cp.kill()
cp.wait()
check(wait_until(lambda: srv.stats()["inflight"] == "0" and srv.stats()["active"] == "0", "the slot is freed", 60),
      "after the client went away the request ended and its slot is free")
st = srv.stats()
check(int(st["tokens_generated"]) < 5000, "the cancelled request did not run to its 2000 tokens: %r" % st)
both_serve("a mid-stream disconnect")

# ---- bad input ----
print("-- bad input battery", flush=True)
is_error(post("/v1/chat/completions", b"{\"messages\": [1, 2"), 400, "malformed JSON")
is_error(post("/v1/chat/completions", b"[1,2,3]"), 400, "a JSON array body")
is_error(post("/v1/chat/completions", {"messages": "hi"}), 400, "messages of the wrong type")
is_error(post("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}), 400, "content of the wrong type")
is_error(post("/v1/completions", {"prompt": 5}), 400, "prompt of the wrong type")
is_error(post("/v1/completions", {"prompt": "x", "max_tokens": "5"}), 400, "max_tokens as a string")
is_error(post("/v1/completions", {"prompt": "x", "stream": "yes"}), 400, "stream as a string")
is_error(post("/v1/completions", {"prompt": "x", "model": 7}), 400, "model as a number")
is_error(post("/v1/completions", {"prompt": "x", "stop": [1]}), 400, "stop of the wrong type")
is_error(post("/v1/completions", {"prompt": "x", "model": "nope"}), 404, "unknown model")
is_error(post("/v1/completions", b""), 400, "an empty body")
is_error(raw(b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n"), 404, "an unknown path")
is_error(raw(b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"), 405, "GET on a POST endpoint")
is_error(post("/v1/completions", {"prompt": "x", "temperature": 99}), 400, "temperature out of range")
both_serve("malformed and mistyped requests")

# Not HTTP, or HTTP H2O refuses: a 400 (or a close), never a hang or a crash.
for name, data in (("bytes that are not HTTP", b"\x00\x01\x02hello\r\n\r\n"),
                   ("500 headers", b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(500)) + b"\r\n"),
                   ("the HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
                   ("a bad chunk size", b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
                   ("a Content-Length of 20 digits", b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n")):
    r = raw(data, want_close=True)
    check(r == b"" or status(r) == 400, "%s: 400 or a close (%r)" % (name, r[:60]))
deep = b"[" * 10000 + b"]" * 10000
is_error(post("/v1/completions", deep), 400, "JSON nested 10000 deep")
r = post("/tokenize", b'{"con' + b'tent": "hello"}')
check(status(r) == 200 and len(body_json(r)["tokens"]) == 5, "tokenize: %r" % r[-60:])
r = raw(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"con\r\n10\r\ntent\": \"hello\"}\r\n0\r\n\r\n")
check(status(r) == 200 and len(body_json(r)["tokens"]) == 5, "a chunked body is read whole: %r" % r[-60:])
r = post("/tokenize", {"content": "hey", "with_pieces": True})
tp = body_json(r)["tokens"] if status(r) == 200 else []
check(len(tp) == 3 and "".join(t["piece"] for t in tp) == "hey" and all(isinstance(t["id"], int) for t in tp),
      "tokenize with_pieces: ids and their text: %r" % tp)
r = post("/detokenize", {"tokens": [107, 104]})
check(status(r) == 200 and body_json(r)["content"] == "he", "detokenize: %r" % r[-60:])
is_error(post("/detokenize", {"tokens": [99999999]}), 400, "a token id out of range")
both_serve("requests H2O refuses")

big = b"{\"prompt\": \"" + b"a" * (300 * 1024) + b"\"}"
r = post("/v1/completions", big)
check(r == b"" or status(r) == 413, "a body over max_line: 413 or a closed connection (%r)" % r[:80])
both_serve("a huge body")

r = raw(b"GET /health HTTP/1.0\r\n\r\n", want_close=True)
check(status(r) == 200 and b'"ok"' in r, "HTTP/1.0: answered, then closed: %r" % r[:120])
r = raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", want_close=True)
st = re.findall(rb"HTTP/1\.1 (\d+)", r)
check(st == [b"200", b"200", b"404"] and r.index(b'"status"') < r.index(b'"data"'), "pipelined requests answered in order: %r" % st)

t0 = time.time()
s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=60)
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
try:
    got = s.recv(1000)
    while got and s.recv(1000):
        pass
    closed = True
except socket.timeout:
    closed = False
s.close()
check(closed, "slow headers: the connection is closed (line_timeout 3 s; after %.1f s)" % (time.time() - t0))
both_serve("slow headers")

print("-- %d idle keep-alive connections" % N_IDLE, flush=True)
fds0 = srv.nfds()
idle = []
for i in range(N_IDLE):
    s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=60)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    idle.append(s)
ok = 0
for s in idle:
    d = b""
    while not complete(d):
        x = s.recv(4096)
        if not x:
            break
        d += x
    ok += status(d) == 200
check(ok == N_IDLE, "every keep-alive connection answered (%d of %d)" % (ok, N_IDLE))
# Beyond max_clients (N_IDLE + 64 HTTP connections): 503 with an error object, then a close.
extra, over = [], []
for i in range(70):
    s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=60)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    extra.append(s)
for s in extra:
    d = b""
    while not complete(d):
        x = s.recv(4096)
        if not x:
            break
        d += x
    if status(d) == 503:
        over.append(d)
    s.close()
check(len(over) >= 6 and all(body_json(d)["error"]["code"] == "too_many_clients" for d in over),
      "connections over max_clients: 503 too_many_clients with a whole body (%d of 70)" % len(over))
both_serve("%d idle keep-alive connections" % N_IDLE)
r = cli.completions.create(model="demo", prompt="Once upon a time", max_tokens=8, temperature=0)
check(r.choices[0].text.encode() == want[:len(r.choices[0].text.encode())], "a generation beside the idle connections")
for s in idle:
    s.close()
check(wait_until(lambda: srv.nfds() <= fds0 + 8, "descriptors back", 60), "the idle connections' descriptors are released")

# ---- /metrics ----
print("-- /metrics parsed by prometheus_client", flush=True)
txt = raw(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
check(status(txt) == 200 and re.search(rb"(?i)content-type: text/plain; version=0\.0\.4", txt), "/metrics: 200 text/plain 0.0.4")
head, body = txt.split(b"\r\n\r\n", 1)
if re.search(rb"(?i)transfer-encoding: *chunked", head):
    out, rest = b"", body
    while rest:
        n, rest = rest.split(b"\r\n", 1)
        n = int(n, 16)
        if n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2:]
    body = out
fams = {}
try:
    for f in text_string_to_metric_families(body.decode()):
        fams[f.name] = f
    parsed = True
except Exception as ex:  # noqa: BLE001
    parsed = False
    print("parse error: %r" % ex)
check(parsed, "the exposition parses")
need = ["llsrv_requests", "llsrv_prompt_tokens", "llsrv_generation_tokens", "llsrv_time_to_first_token_seconds",
        "llsrv_time_per_output_token_seconds", "llsrv_requests_waiting", "llsrv_kv_blocks_used", "llsrv_kv_blocks_total",
        "llsrv_train_running", "llsrv_device_memory_used_bytes"]
fam = lambda n: fams.get(n) or fams.get(n + "_total")  # noqa: E731
check(all(fam(n) for n in need), "families present: missing %r" % [n for n in need if not fam(n)])


def sample(n, suffix="", labels=None):
    f = fam(n)
    for s_ in (f.samples if f else []):
        if s_.name in (n + suffix, n + "_total" + suffix) and (labels is None or all(s_.labels.get(k) == v for k, v in labels.items())):
            return s_.value
    return None


check((sample("llsrv_requests", labels={"outcome": "cancel"}) or 0) >= 1, "the disconnected stream counts as a cancel")
check((sample("llsrv_requests", labels={"outcome": "length"}) or 0) >= 5, "finished requests by outcome")
check((sample("llsrv_requests", labels={"outcome": "bad_adapter"}) or 0) >= 1, "errors by code (live without training)")
check((sample("llsrv_generation_tokens") or 0) >= 100, "generated tokens counted")
ttft = fam("llsrv_time_to_first_token_seconds")
buckets = [s_.value for s_ in ttft.samples if s_.name.endswith("_bucket")] if ttft else []
cnt = sample("llsrv_time_to_first_token_seconds", "_count") if ttft else None
check(buckets and buckets == sorted(buckets) and buckets[-1] == cnt and cnt >= 5, "TTFT histogram: cumulative buckets, +Inf = count")
check((sample("llsrv_kv_blocks_total") or 0) > 0 and sample("llsrv_kv_blocks_used") is not None, "KV blocks used and total")

# ---- live: the adapter being trained, listed and chosen while training runs ----
print("-- live: the training job's adapter", flush=True)
srv4 = Server(tmp, ["--parallel", "2", "--ctx", "256", "--train-enabled", "--train-mode", "lora", "--train-data",
                    os.path.join(os.environ.get("LL_SOURCE_DIR", "."), "man"), "--train-seq-len", "32", "--train-batch", "1",
                    "--train-steps", "100000", "--train-eval-every", "0", "--train-checkpoint-every", "0", "--threads", "2"], name="live")
c4 = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv4.http_port, api_key="x", max_retries=0, timeout=120)
check(wait_until(lambda: "live" in [m.id for m in c4.models.list().data], "live listed", 300), "/v1/models lists live while training")
r = c4.completions.create(model="live", prompt="Once", max_tokens=4, temperature=0)
check(r.usage.completion_tokens == 4, "a completion from the live adapter")
m4 = raw_to(srv4.http_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
check(b"\nllsrv_train_running 1\n" in m4 and re.search(rb"\nllsrv_train_step \d", m4) is not None, "/metrics: training running, its step")
check(srv4.stop() == 0, "the training server exits 0")

# ---- /health while the model loads ----
print("-- /health: 503 while loading, 200 when serving", flush=True)
ps = socket.socket()
ps.bind(("127.0.0.1", 0))
hport = ps.getsockname()[1]
ps.close()
log5 = open(os.path.join(tmp, "loading.log"), "w+")
env5 = dict(os.environ, LL_TEST_LOAD_DELAY_MS="4000")
p5 = subprocess.Popen([BIN, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:%d" % hport, "--socket", os.path.join(tmp, "l-run", "m.sock"),
                       "--state-dir", os.path.join(tmp, "state"), "--parallel", "1", "--ctx", "128"], stdout=log5, stderr=subprocess.STDOUT, env=env5)


def health5():
    try:
        return raw_to(hport, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    except OSError:
        return b""


check(wait_until(lambda: b"loading" in health5(), "/health says loading", 60), "/health answers while the model loads")
h5 = health5()
check(status(h5) == 503 or b"listening on" in open(log5.name, "rb").read(), "/health is 503 while loading: %r" % h5[:60])
m5 = raw_to(hport, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
check(status(m5) == 503 and b'"loading"' in m5 or b"listening on" in open(log5.name, "rb").read(), "other endpoints: 503 loading: %r" % m5[:80])
check(wait_until(lambda: status(health5()) == 200, "/health 200", 120), "/health is 200 once the model is served")
p5.terminate()
check(p5.wait(60) == 0, "the server that loaded slowly exits 0")

# ---- Qwen3's thinking (issue 32) ----
# A server with the qwen3 chat format: chat_template_kwargs.enable_thinking (vLLM's spelling, via
# the SDK's extra_body), top-level enable_thinking and reasoning_effort "none" (llama-server's)
# give the prompt Qwen3's Jinja template renders (tests/ref/qwen3_chat.json, made with jinja2):
# a completion of that exact text has the same prompt tokens and greedy text. reasoning_format.
print("-- Qwen3 thinking: enable_thinking, chat_template_kwargs, reasoning_format", flush=True)
with open(os.path.join(os.path.dirname(__file__), "..", "ref", "qwen3_chat.json")) as f:
    q3ref = json.load(f)
srvq = Server(tmp, ["--parallel", "2", "--ctx", "256", "--chat-template", "qwen3", "--reasoning-format", "deepseek"], name="qwen3")
cq = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srvq.http_port, api_key="unused", max_retries=0, timeout=120)
q3n = {}
for case in q3ref[:2] + q3ref[24:26]:  # system + user, an answer with reasoning_content; thinking on and off
    want = cq.completions.create(model="demo", prompt=case["expected"], max_tokens=8, temperature=0)
    ways = [{"chat_template_kwargs": {"enable_thinking": case["enable_thinking"]}}, {"enable_thinking": case["enable_thinking"]}]
    if not case["enable_thinking"]:
        ways.append({"reasoning_effort": "none"})
    for eb in ways:
        got = cq.chat.completions.create(model="demo", messages=case["messages"], max_tokens=8, temperature=0,
                                         extra_body=dict(eb, reasoning_format="none"))  # the text as generated
        check(got.usage.prompt_tokens == want.usage.prompt_tokens and got.choices[0].message.content == want.choices[0].text,
              "%r: the prompt is Qwen3's rendering (%d vs %d prompt tokens, %r vs %r)" % (eb, got.usage.prompt_tokens, want.usage.prompt_tokens,
                                                                                         got.choices[0].message.content, want.choices[0].text))
    if len(case["messages"]) == 2 and case["messages"][0]["role"] == "system":
        q3n[case["enable_thinking"]] = want.usage.prompt_tokens
check(q3n[False] > q3n[True], "enable_thinking false adds the empty think block: %r" % q3n)
raises(openai.BadRequestError, lambda: cq.chat.completions.create(model="demo", messages=q3ref[0]["messages"], max_tokens=2,
                                                                   extra_body={"chat_template_kwargs": {"enable_thinking": "no"}}),
       "chat_template_kwargs.enable_thinking must be a boolean")
raises(openai.BadRequestError, lambda: cq.chat.completions.create(model="demo", messages=q3ref[0]["messages"], max_tokens=2,
                                                                   extra_body={"reasoning_format": "deepseek-v9"}),
       "an unknown reasoning_format is refused")
# reasoning_format deepseek (the server's option here; a request's "none" overrides it) on an answer
# without "<think>" (the demo model never writes one; the split itself is test_proto's, against
# llama.cpp's): the content less its leading whitespace (as llama-server), streamed and not, and
# no reasoning_content.
plain = cq.chat.completions.create(model="demo", messages=q3ref[1]["messages"], max_tokens=12, temperature=0,
                                   extra_body={"reasoning_format": "none"})
want_c = plain.choices[0].message.content.lstrip(" \t\r\n")
rf = cq.chat.completions.create(model="demo", messages=q3ref[1]["messages"], max_tokens=12, temperature=0)
check(rf.choices[0].message.content == want_c and getattr(rf.choices[0].message, "reasoning_content", None) is None,
      "reasoning_format deepseek without a think block: the content (%r vs %r)" % (rf.choices[0].message.content, want_c))
sp = "".join(c.choices[0].delta.content or "" for c in cq.chat.completions.create(
    model="demo", messages=q3ref[1]["messages"], max_tokens=12, temperature=0, stream=True, extra_body={"reasoning_format": "auto"}) if c.choices)
check(sp == want_c, "streamed with reasoning_format deepseek: %r vs %r" % (sp, want_c))
check(srvq.stop() == 0, "the qwen3 server exits 0")

# ---- auth ----
print("-- auth: Bearer token", flush=True)
srv2 = Server(tmp, ["--parallel", "1", "--ctx", "128", "--auth-token", "s3cret"], name="auth")
B2 = "http://127.0.0.1:%d/v1" % srv2.http_port
raises(openai.AuthenticationError, lambda: openai.OpenAI(base_url=B2, api_key="wrong", max_retries=0).models.list(),
       "a wrong key -> AuthenticationError")
ok2 = openai.OpenAI(base_url=B2, api_key="s3cret", max_retries=0).completions.create(model="demo", prompt="x", max_tokens=2)
check(ok2.usage.completion_tokens >= 1, "the right key is served")
check(srv2.stop() == 0, "the auth server exits 0")
r = subprocess.run([BIN, "--listen", "127.0.0.1:0", "--http", "0.0.0.0:0", "--state-dir", os.path.join(tmp, "state")],
                   capture_output=True, text=True, timeout=60)
check(r.returncode == 2 and "auth_token" in r.stderr and "HTTP" in r.stderr, "HTTP on a non-loopback address without a token refused: %r" % r.stderr[-200:])

# ---- adapters chosen by model (stories260K) ----
model = os.path.join(os.environ.get("LL_SHARED_DIR", ""), "testdata", "models", "stories260K.bin")
if os.path.exists(model):
    print("-- adapters chosen by `model` (stories260K)", flush=True)
    maker = os.path.join(BUILD, "tests", "test_lora")
    ad = os.path.join(tmp, "good.gguf")
    subprocess.run([maker, "--make-adapter", model, ad, "4", "8", "5", "0.3"], check=True)
    srv3 = Server(tmp, ["--model", model, "--adapter", ad, "--parallel", "4", "--ctx", "256"], name="lora")
    c3 = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv3.http_port, api_key="x", max_retries=0)
    ids3 = [m.id for m in c3.models.list().data]
    check(ids3 == ["stories260K", "good"], "models: the base and the adapter: %r" % ids3)
    got = {m: c3.completions.create(model=m, prompt="1 2 3", max_tokens=24, temperature=0).choices[0].text for m in ids3}
    conn = srv3.conn(timeout=120)
    line = {}
    for m, a in (("stories260K", "none"), ("good", "good")):
        t, _, _ = conn.generate("GEN adapter=%s max_tokens=24 temperature=0 :1 2 3" % a)
        line[m] = t.decode()
    conn.close()
    check(got == line, "each model's text equals GEN adapter=NAME's: %r vs %r" % (got, line))
    check(got["good"] != got["stories260K"], "the adapter changes the output")
    raises(openai.BadRequestError, lambda: c3.chat.completions.create(model="good", messages=[{"role": "user", "content": "1 2"}], max_tokens=4),
           "chat on a model without a tokenizer -> BadRequestError")
    check(srv3.stop() == 0, "the adapter server exits 0")
else:
    print("stories260K.bin absent (../shared/testdata): adapters by model not tested")

check(srv.stop() == 0, "the server exits 0 on SIGTERM")
sys.exit(check.summary())
