#!/usr/bin/env python3
# test_http_finetune.py - OpenAI's fine-tuning API (man 7 llsrv-http, FINE-TUNING) with the
# official `openai` package, on the embedded demo model:
#   - upload a chat JSONL file (files.create), list / retrieve it; a file with a bad line is a
#     BadRequestError naming the line;
#   - a job (a few steps) runs validating_files -> queued -> running -> succeeded; its events
#     carry the loss of each step, its checkpoints one per epoch; its model ft:demo:SUFFIX:ID is
#     in models.list, answers a chat, and differs from the base model (logprobs); GEN
#     adapter=ft:... on the line protocol gives the same greedy text as the HTTP completion;
#   - errors as the SDK's exception types: unknown job -> NotFoundError, unknown training_file
#     and bad hyperparameters -> BadRequestError;
#   - cancel of a queued job and of a running one (it stops; no model); /metrics counts jobs by
#     status and carries the running job's step and loss (prometheus_client's parser);
#   - a restart: files, jobs and events listed again, the model served again with the same
#     answer, and a job that was running resumes from its checkpoint;
#   - beside the configured train: run: the job takes the training thread (the monitor's
#     training.yielded_to), the run stands still, then goes on;
#   - bad input on raw sockets: malformed multipart bodies, an upload over max_upload (413), a
#     JSON body over max_line, bad list parameters, a file in use deleted; both protocols keep
#     serving.
import json
import os
import re
import socket
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from llsrv_client import ensure_venv  # noqa: E402

ensure_venv(["openai>=1.30,<3", "prometheus_client>=0.17"], ["openai", "prometheus_client"])

import openai  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from llsrv_client import Checker, Monitor, Server, wait_until  # noqa: E402

check = Checker()
tmp = tempfile.mkdtemp(prefix="llsrv-ft-")
os.chmod(tmp, 0o700)
ARGS = ["--parallel", "2", "--ctx", "512", "--max-line", "64K", "--max-upload", "256K"]
srv = Server(tmp, ARGS)
cli = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.http_port, api_key="unused", max_retries=0, timeout=120)

QA = [("What is llsrv?", "llsrv serves a small model."), ("Who trains it?", "It trains itself."),
      ("What is LoRA?", "Small adapters on a model."), ("Is it fast?", "Fast enough on two cores.")]


def chat_lines(n):
    return "".join(json.dumps({"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": QA[i % 4][0]},
                                            {"role": "assistant", "content": QA[i % 4][1]}]}) + "\n" for i in range(n))


def write(name, text):
    p = os.path.join(tmp, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def raises(exc, fn, what):
    try:
        fn()
    except exc as e:
        check(True, what)
        return e
    except Exception as e:  # noqa: BLE001
        check(False, "%s: %r instead of %s" % (what, e, exc.__name__))
        return None
    check(False, "%s: no exception" % what)
    return None


def job_status(jid, want, timeout=180):
    return wait_until(lambda: cli.fine_tuning.jobs.retrieve(jid).status in want, "job %s in %s" % (jid, want), timeout, step=0.2)


def line_gen(params, text):
    c = srv.conn(timeout=120)
    t, kv, _ = c.generate("GEN %s :%s" % (params, text))
    c.close()
    return t, kv


# ---- files ----
print("-- files: upload, list, retrieve; a bad line named", flush=True)
good = write("train.jsonl", chat_lines(12))
f = cli.files.create(file=open(good, "rb"), purpose="fine-tune")
check(f.id.startswith("file-") and f.purpose == "fine-tune" and f.bytes == os.path.getsize(good) and f.filename == "train.jsonl",
      "files.create: %r" % f)
check(f.id in [x.id for x in cli.files.list().data], "files.list has the upload")
check(cli.files.retrieve(f.id).bytes == f.bytes, "files.retrieve")
bad = write("bad.jsonl", chat_lines(2) + '{"messages": [{"role": "user", "content": "no answer"}]}\n' + chat_lines(1))
e = raises(openai.BadRequestError, lambda: cli.files.create(file=open(bad, "rb"), purpose="fine-tune"), "a bad line -> BadRequestError")
check(e is not None and "line 3" in str(e) and "assistant" in str(e), "the error names line 3 and why: %s" % e)
e = raises(openai.BadRequestError, lambda: cli.files.create(file=open(write("j.jsonl", '{"messages": [}\n'), "rb"), purpose="fine-tune"),
           "invalid JSON -> BadRequestError")
check(e is not None and "line 1" in str(e), "invalid JSON: line 1 named: %s" % e)
raises(openai.BadRequestError, lambda: cli.files.create(file=open(write("e.jsonl", "\n\n"), "rb"), purpose="fine-tune"), "no examples")
raises(openai.BadRequestError, lambda: cli.files.create(file=open(good, "rb"), purpose="assistants"), "purpose other than fine-tune")
raises(openai.NotFoundError, lambda: cli.files.retrieve("file-000000000000000000000000"), "unknown file -> NotFoundError")

# ---- a job to success ----
print("-- a job: validating_files -> queued -> running -> succeeded", flush=True)
base = cli.models.list().data[0].id
check(base == "demo", "the base model is demo: %r" % base)
j = cli.fine_tuning.jobs.create(model=base, training_file=f.id, suffix="t1", hyperparameters={"n_epochs": 2}, seed=7)
check(j.id.startswith("ftjob-") and j.status in ("validating_files", "queued", "running") and j.training_file == f.id and
      j.hyperparameters.n_epochs == 2, "jobs.create: %r" % j)
seen = set()
t0 = time.time()
while time.time() - t0 < 180:
    s = cli.fine_tuning.jobs.retrieve(j.id)
    seen.add(s.status)
    if s.status in ("succeeded", "failed", "cancelled"):
        break
    time.sleep(0.1)
check(s.status == "succeeded", "the job succeeded (%.1f s): %r" % (time.time() - t0, s))
check(seen <= {"validating_files", "queued", "running", "succeeded"}, "only OpenAI's statuses on the way: %r" % seen)
FT = "ft:demo:t1:%s" % j.id[6:14]
check(s.fine_tuned_model == FT and s.finished_at and s.trained_tokens > 0, "fine_tuned_model %r (want %r)" % (s.fine_tuned_model, FT))
check(isinstance(s.hyperparameters.batch_size, int) and s.hyperparameters.learning_rate_multiplier == 1.0,
      "auto hyperparameters resolved: %r" % s.hyperparameters)
total = s.to_dict().get("total_steps")
ev = cli.fine_tuning.jobs.list_events(j.id, limit=100).data
metrics = [e for e in ev if e.type == "metrics"]
check(total and len(metrics) == total, "one metrics event per step: %d of %r" % (len(metrics), total))
check(all(isinstance(e.data["train_loss"], float) and e.data["train_loss"] > 0 for e in metrics), "each step's loss in its event")
check(any(e.data.get("valid_loss") for e in metrics), "a validation loss in the events")
check([e.data["step"] for e in metrics] == list(range(total, 0, -1)), "events newest first")
msgs = [e.message for e in ev]
check(any("successfully completed" in m for m in msgs) and any("Validating training file" in m for m in msgs), "events: %r" % msgs[:4])
page = cli.fine_tuning.jobs.list_events(j.id, limit=2)
check(len(page.data) == 2 and page.has_more, "events: limit and has_more")
nxt = cli.fine_tuning.jobs.list_events(j.id, limit=2, after=page.data[-1].id).data
check(nxt and nxt[0].id == ev[2].id, "events: after= pages on")
ck = cli.fine_tuning.jobs.checkpoints.list(j.id).data
check(len(ck) == 2 and ck[0].step_number == total and ck[0].fine_tuned_model_checkpoint.startswith(FT), "a checkpoint per epoch: %r" % ck)
check(FT in [m.id for m in cli.models.list().data], "models.list has %s" % FT)
check(j.id in [x.id for x in cli.fine_tuning.jobs.list().data], "jobs.list has the job")

print("-- the fine-tuned model answers", flush=True)
m = [{"role": "user", "content": "What is llsrv?"}]
r = cli.chat.completions.create(model=FT, messages=m, max_tokens=8, temperature=0)
check(r.model == FT and r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0, "chat with %s: %r" % (FT, r))
pf = cli.completions.create(model=FT, prompt="What is llsrv?", max_tokens=4, temperature=0, logprobs=1).choices[0].logprobs
pb = cli.completions.create(model=base, prompt="What is llsrv?", max_tokens=4, temperature=0, logprobs=1).choices[0].logprobs
check(pf.token_logprobs != pb.token_logprobs, "the adapter changes the model: logprobs %r vs the base's %r" % (pf.token_logprobs, pb.token_logprobs))
c = cli.completions.create(model=FT, prompt="Who trains it?", max_tokens=12, temperature=0)
want, _ = line_gen("max_tokens=12 temperature=0 adapter=%s" % FT, "Who trains it?")
check(c.choices[0].text.encode() == want, "GEN adapter=%s equals the HTTP completion: %r vs %r" % (FT, want, c.choices[0].text))
answer_before = c.choices[0].text

# ---- errors ----
print("-- errors as the SDK's exception types", flush=True)
raises(openai.NotFoundError, lambda: cli.fine_tuning.jobs.retrieve("ftjob-000000000000000000000000"), "unknown job -> NotFoundError")
raises(openai.NotFoundError, lambda: cli.fine_tuning.jobs.list_events("ftjob-nope"), "events of an unknown job -> NotFoundError")
raises(openai.NotFoundError, lambda: cli.fine_tuning.jobs.cancel("ftjob-nope"), "cancel of an unknown job -> NotFoundError")
e = raises(openai.BadRequestError, lambda: cli.fine_tuning.jobs.create(model=base, training_file="file-000000000000000000000000"),
           "unknown training_file -> BadRequestError")
check(e is not None and e.code == "invalid_training_file", "code invalid_training_file")
raises(openai.NotFoundError, lambda: cli.fine_tuning.jobs.create(model="gpt-4o", training_file=f.id), "another base model -> NotFoundError")
raises(openai.BadRequestError, lambda: cli.fine_tuning.jobs.create(model=base, training_file=f.id, hyperparameters={"n_epochs": 0}),
       "n_epochs 0 -> BadRequestError")
raises(openai.BadRequestError, lambda: cli.fine_tuning.jobs.create(model=base, training_file=f.id, hyperparameters={"batch_size": "big"}),
       "batch_size 'big' -> BadRequestError")
raises(openai.BadRequestError, lambda: cli.fine_tuning.jobs.create(model=base, training_file=f.id, suffix="a:b"), "':' in suffix")
raises(openai.BadRequestError, lambda: cli.fine_tuning.jobs.cancel(j.id), "cancel of a succeeded job -> BadRequestError")

# ---- cancel ----
print("-- cancel: a queued job and a running one", flush=True)
long1 = cli.fine_tuning.jobs.create(model=base, training_file=f.id, suffix="long", hyperparameters={"n_epochs": 50, "batch_size": 4})
long2 = cli.fine_tuning.jobs.create(model=base, training_file=f.id, suffix="q", hyperparameters={"n_epochs": 50})
check(job_status(long1.id, ("running",)), "the first long job runs")
s2 = job_status(long2.id, ("queued", "running", "failed"), 60) and cli.fine_tuning.jobs.retrieve(long2.id)
check(s2 and s2.status == "queued", "the second one queues behind it (one job trains at a time): %s" % (s2 and s2.status))
cq = cli.fine_tuning.jobs.cancel(long2.id)
check(cq.status == "cancelled", "cancel of a queued job: %s" % cq.status)
wait_until(lambda: cli.fine_tuning.jobs.retrieve(long1.id).to_dict().get("step", 0) >= 3, "long job at step 3", 120, step=0.2)
s1 = cli.fine_tuning.jobs.retrieve(long1.id)
check(s1.to_dict().get("step", 0) >= 3, "the running job advances: step %r" % s1.to_dict().get("step"))
mt = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % srv.http_port, timeout=30).read().decode()
fam = {f.name: f for f in text_string_to_metric_families(mt)}
jobs_by = {x.labels["status"]: x.value for x in fam["llsrv_fine_tuning_jobs"].samples} if "llsrv_fine_tuning_jobs" in fam else {}
check(jobs_by.get("running") == 1 and jobs_by.get("succeeded") == 1 and jobs_by.get("cancelled") == 1,
      "/metrics: fine-tuning jobs by status: %r" % jobs_by)
check("llsrv_fine_tuning_step" in fam and fam["llsrv_fine_tuning_step"].samples[0].value >= 3 and "llsrv_fine_tuning_loss" in fam and
      fam["llsrv_fine_tuning_loss"].samples[0].value > 0, "/metrics: the running job's step and loss")

# ---- restart ----
print("-- restart: the store comes back; a running job resumes", flush=True)
step_before = s1.to_dict()["step"]
rc = srv.stop()
check(rc == 0, "SIGTERM with a job running: exit 0 (%r)" % rc)
# Damaged records beside the good ones: each is logged and left out, the rest comes back.
st_dir = os.path.join(tmp, "state", "fine_tuning")
bad_jobs = {"ftjob-" + "a" * 24: '{"version": 1, "job": {"id": "ftjob-' + "a" * 24 + '"', # cut short
            "ftjob-" + "b" * 24: json.dumps({"version": 1, "job": {}, "llsrv": {}, "events": 5, "checkpoints": []}),
            "ftjob-" + "c" * 24: "\x00\xff" * 100}
good_rec = json.load(open(os.path.join(st_dir, "jobs", j.id + ".json")))
good_rec["llsrv"]["steps"] = -4  # out of range
good_rec["job"]["id"] = "ftjob-" + "d" * 24
bad_jobs["ftjob-" + "d" * 24] = json.dumps(good_rec)
for k, v in bad_jobs.items():
    write(os.path.join(st_dir, "jobs", k + ".json"), v)
write(os.path.join(st_dir, "files", "file-" + "e" * 24 + ".json"), '{"id": "file-' + "e" * 24 + '", "bytes": 1e400}')
srv = Server(tmp, ARGS, name="srv2")
log = srv.output()
check(all(("%s.json left out" % k) in log for k in bad_jobs) and ("file-" + "e" * 24 + ".json left out") in log,
      "each damaged record is logged as left out: %r" % [ln for ln in log.splitlines() if "left out" in ln])
cli = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.http_port, api_key="unused", max_retries=0, timeout=120)
check(f.id in [x.id for x in cli.files.list().data], "the file is listed after the restart")
ids = [x.id for x in cli.fine_tuning.jobs.list(limit=100).data]
check(ids == [long2.id, long1.id, j.id], "the jobs are listed, newest first, the damaged ones left out: %r" % ids)
check(cli.fine_tuning.jobs.retrieve(long2.id).status == "cancelled", "the cancelled job stays cancelled")
s = cli.fine_tuning.jobs.retrieve(j.id)
check(s.status == "succeeded" and s.fine_tuned_model == FT, "the succeeded job stays succeeded")
check(len([e for e in cli.fine_tuning.jobs.list_events(j.id, limit=100).data if e.type == "metrics"]) == total, "its events come back")
check(FT in [m.id for m in cli.models.list().data], "its model is served again")
c = cli.completions.create(model=FT, prompt="Who trains it?", max_tokens=12, temperature=0)
check(c.choices[0].text == answer_before, "the same answer after the restart: %r vs %r" % (c.choices[0].text, answer_before))
check(job_status(long1.id, ("running",), 60), "the interrupted job runs again")
resumed = wait_until(lambda: [e for e in cli.fine_tuning.jobs.list_events(long1.id, limit=100).data if "Resumed" in e.message], "resumed event",
                     60, step=0.2)
check(resumed, "its events say it resumed from a checkpoint")
m = re.search(r"step (\d+)", resumed[0].message) if resumed else None
check(m and int(m.group(1)) >= step_before, "resumed where the stop left it (its shutdown checkpoint: step %r; step %d before the stop)" % (m and m.group(1), step_before))
c1 = cli.fine_tuning.jobs.cancel(long1.id)
check(c1.status == "cancelled", "cancel of a running job: %s" % c1.status)
time.sleep(3)
s1 = cli.fine_tuning.jobs.retrieve(long1.id)
check(s1.status == "cancelled" and s1.fine_tuned_model is None, "a cancelled job stays cancelled, no model: %r" % s1.status)
check(not [m for m in cli.models.list().data if m.id.startswith("ft:demo:long")], "no model of the cancelled job")

# ---- bad input on raw sockets ----
print("-- bad input: multipart, sizes, parameters", flush=True)


def raw(data, timeout=30):
    s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=timeout)
    try:
        s.sendall(data)
    except OSError:
        pass
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
            if b"\r\n\r\n" in out:
                head, body = out.split(b"\r\n\r\n", 1)
                mm = re.search(rb"(?i)content-length: *(\d+)", head)
                if mm and len(body) >= int(mm.group(1)):
                    break
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
    return out


def status(resp):
    mm = re.match(rb"HTTP/1\.[01] (\d+)", resp)
    return int(mm.group(1)) if mm else None


def is_error(resp, code, what, needle=None):
    try:
        err = json.loads(resp.split(b"\r\n\r\n", 1)[1])["error"]
        ok = status(resp) == code and err["message"] and "type" in err and (needle is None or needle in err["message"])
    except Exception as ex:  # noqa: BLE001
        ok, err = False, ex
    return check(ok, "%s: %d with an OpenAI error object (got %r)" % (what, code, resp[:300]))


def both_serve(what):
    c = srv.conn(timeout=30)
    pong = c.request("PING")
    c.close()
    h = raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    check(pong == "PONG" and status(h) == 200, "both protocols serve after %s" % what)


def upload(body, ctype=b"multipart/form-data; boundary=XyZ"):
    return raw(b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (ctype, len(body)) + body)


def part(name, data, filename=None):
    fn = b'; filename="%s"' % filename if filename else b""
    return b'--XyZ\r\nContent-Disposition: form-data; name="%s"%s\r\n\r\n%s\r\n' % (name, fn, data)


ok_body = part(b"purpose", b"fine-tune") + part(b"file", chat_lines(3).encode(), b"x.jsonl") + b"--XyZ--\r\n"
check(status(upload(ok_body)) == 200, "a hand-made multipart upload is accepted")
is_error(upload(ok_body, b"application/json"), 400, "an upload that is not multipart", "multipart")
is_error(upload(ok_body, b"multipart/form-data"), 400, "multipart without a boundary", "boundary")
is_error(upload(ok_body[:-30]), 400, "a multipart body cut short", "boundary")
is_error(upload(part(b"purpose", b"fine-tune") + b"--XyZ--\r\n"), 400, "no file part", "file")
is_error(upload(b"--XyZ\r\nX-Nothing: 1\r\n\r\nabc\r\n--XyZ--\r\n"), 400, "a part without Content-Disposition", "Content-Disposition")
is_error(upload(b"garbage without any boundary"), 400, "a body without boundary lines")
is_error(upload(part(b"purpose", b"fine-tune") + part(b"file", b'{"messages": 1}\n', b"x.jsonl") + b"--XyZ--\r\n"), 400,
         "a JSONL whose line 1 is wrong", "line 1")
big = part(b"purpose", b"fine-tune") + part(b"file", chat_lines(2000).encode(), b"big.jsonl") + b"--XyZ--\r\n"
check(len(big) > 256 * 1024, "the big upload is over max_upload")
check(status(upload(big)) == 413, "an upload over max_upload: 413")
both_serve("a huge upload")
jb = json.dumps({"model": base, "training_file": f.id, "suffix": "x" * 70000}).encode()
check(status(raw(b"POST /v1/fine_tuning/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(jb) + jb)) == 413,
      "a job body over max_line: 413")
is_error(raw(b"POST /v1/fine_tuning/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{nope"), 400, "a job body that is not JSON")
is_error(raw(b"GET /v1/fine_tuning/jobs?limit=0 HTTP/1.1\r\nHost: x\r\n\r\n"), 400, "limit=0", "limit")
is_error(raw(b"GET /v1/fine_tuning/jobs?limit=abc HTTP/1.1\r\nHost: x\r\n\r\n"), 400, "limit=abc", "limit")
is_error(raw(b"PUT /v1/fine_tuning/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"), 405, "PUT on the jobs list")
is_error(raw(b"GET /v1/fine_tuning/nothing HTTP/1.1\r\nHost: x\r\n\r\n"), 404, "an unknown fine-tuning path")
# A file too short for one training sequence passes the upload (its lines are fine) and fails
# the job while its file is validated, as OpenAI's jobs fail.
tiny = cli.files.create(file=open(write("tiny.jsonl", json.dumps({"messages": [{"role": "user", "content": "a"},
                                                                           {"role": "assistant", "content": "b"}]}) + "\n"), "rb"),
                        purpose="fine-tune")
jt = cli.fine_tuning.jobs.create(model=base, training_file=tiny.id)
st = job_status(jt.id, ("failed", "succeeded"), 60) and cli.fine_tuning.jobs.retrieve(jt.id)
check(st and st.status == "failed" and st.error.code == "invalid_training_file" and "token" in st.error.message,
      "a file too short fails its job with invalid_training_file: %r" % (st and st.error))
# A file in use by a queued or running job cannot be deleted; an unused one can.
f2 = cli.files.create(file=open(good, "rb"), purpose="fine-tune")
busy = cli.fine_tuning.jobs.create(model=base, training_file=f2.id, hyperparameters={"n_epochs": 50})
raises(openai.BadRequestError, lambda: cli.files.delete(f2.id), "deleting a file a job uses -> BadRequestError")
cli.fine_tuning.jobs.cancel(busy.id)
d = cli.files.delete(f2.id)
check(d.deleted and d.id == f2.id, "files.delete after the job is cancelled: %r" % d)
raises(openai.NotFoundError, lambda: cli.files.retrieve(f2.id), "a deleted file -> NotFoundError")
check(not os.path.exists(os.path.join(tmp, "state", "fine_tuning", "files", f2.id + ".jsonl")) or
      wait_until(lambda: not os.path.exists(os.path.join(tmp, "state", "fine_tuning", "files", f2.id + ".jsonl")), "file removed", 10),
      "its data is removed from the state directory")
both_serve("the bad-input battery")

rc = srv.stop()
check(rc == 0, "SIGTERM: exit 0 (%r)" % rc)

# ---- beside the configured run ----
print("-- a job beside the configured train: run: it yields, then goes on", flush=True)
src = os.environ.get("LL_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
targs = ARGS + ["--config", os.path.join(src, "configs", "demo.yaml"), "--train-data", os.path.join(src, "man"), "--train-seq-len", "64",
                "--train-batch", "2", "--train-eval-every", "0", "--train-checkpoint-every", "1000", "--train-steps", "100000"]
srv = Server(tmp, targs, name="srv3")
cli = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.http_port, api_key="unused", max_retries=0, timeout=120)
mon = Monitor(srv.sock)
check(wait_until(lambda: (mon.snapshot()["training"]["step"] or 0) >= 2, "configured run at step 2", 120), "the configured run trains")
jc = cli.fine_tuning.jobs.create(model=base, training_file=f.id, suffix="beside", hyperparameters={"n_epochs": 4})
snap = wait_until(lambda: (lambda t: t if t["yielded_to"] == jc.id else None)(mon.snapshot()["training"]), "yielded_to the job", 60)
check(snap and snap["state"] == "running", "the monitor's training.yielded_to names the job while it trains: %r" % (snap and snap["yielded_to"]))
step_at_yield = snap["step"] if snap else -1
# Every snapshot taken while the job has the thread shows the configured run at the same step.
steps, t0 = [step_at_yield], time.time()
while time.time() - t0 < 180:
    t = mon.snapshot()["training"]
    if t["yielded_to"] != jc.id:
        break
    steps.append(t["step"])
check(len(steps) >= 2 and set(steps) == {step_at_yield}, "the configured run stands still while the job trains: steps %r in %d snapshots (%d at the yield)" %
      (sorted(set(steps)), len(steps), step_at_yield))
check(job_status(jc.id, ("succeeded", "failed"), 60) and cli.fine_tuning.jobs.retrieve(jc.id).status == "succeeded", "the job succeeds")
check(wait_until(lambda: mon.snapshot()["training"]["step"] >= step_at_yield + 2, "configured run goes on", 120), "the configured run goes on after the job")
mon.close()
rc = srv.stop()
check(rc == 0, "SIGTERM with the configured run: exit 0 (%r)" % rc)
sys.exit(check.summary())
