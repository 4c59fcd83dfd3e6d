"""Scenarios the end-to-end tests of `onepass serve` run through the real `openai` client.

Usage: python3 client.py SCENARIO BASE_URL [JSON_ARGS]. Prints one JSON object on the last line
of standard output; the Rust test checks it. Every loop here is bounded in count and time, and
the only address it talks to is the BASE_URL it is given (the tests pass 127.0.0.1).
"""

import concurrent.futures
import json
import sys
import time
import urllib.error
import urllib.request

import openai

TIMEOUT_S = 120.0


KEY = {"value": "none"}


def client(base_url):
    # No retries: a 429 must reach the test, not be retried away.
    return openai.OpenAI(base_url=base_url + "/v1", api_key=KEY["value"], max_retries=0,
                         timeout=TIMEOUT_S)


def model_id(base_url):
    return client(base_url).models.list().data[0].id


def metric(base_url, name):
    req = urllib.request.Request(base_url + "/metrics")
    req.add_header("Authorization", "Bearer " + KEY["value"])
    with urllib.request.urlopen(req, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise SystemExit("metric %s not found" % name)


def post_raw(base_url, path, body, headers=None):
    """Status and JSON body of a POST with a raw body."""
    req = urllib.request.Request(base_url + path, data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def basic(base_url, args):
    c = client(base_url)
    model = model_id(base_url)
    prompt = args.get("prompt", "The capital of France is")
    out = {"model": model}
    chat = c.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        max_tokens=12,
        temperature=0,
    )
    out["chat"] = {
        "text": chat.choices[0].message.content,
        "finish_reason": chat.choices[0].finish_reason,
        "usage": chat.usage.model_dump(),
        "object": chat.object,
    }
    pieces, reasons, usage, roles = [], [], None, []
    stream = c.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    out["chat_stream"] = {"text": "".join(pieces), "pieces": len(pieces), "finish_reasons": reasons,
                          "usage": usage, "roles": roles}
    comp = c.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0)
    out["completion"] = {
        "text": comp.choices[0].text,
        "finish_reason": comp.choices[0].finish_reason,
        "usage": comp.usage.model_dump(),
    }
    pieces, reasons = [], []
    for chunk in c.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0,
                                      stream=True):
        for choice in chunk.choices:
            pieces.append(choice.text)
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    out["completion_stream"] = {"text": "".join(pieces), "finish_reasons": reasons}
    # A stop string taken from the greedy text: the answer ends before it.
    full = out["completion"]["text"]
    stop = full[len(full) // 2:len(full) // 2 + 3]
    if stop.strip():
        stopped = c.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0,
                                       stop=[stop])
        out["stop"] = {"stop": stop, "text": stopped.choices[0].text,
                       "finish_reason": stopped.choices[0].finish_reason}
    sampled = [c.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0.8,
                                    top_p=0.9, seed=42).choices[0].text for _ in range(2)]
    out["seeded_samples"] = sampled
    return out


def concurrent_greedy(base_url, args):
    c = client(base_url)
    model = model_id(base_url)

    def one(prompt):
        r = c.completions.create(model=model, prompt=prompt, max_tokens=args["max_tokens"],
                                 temperature=0, extra_body={"return_token_ids": True})
        choice = r.choices[0]
        return {"prompt": prompt, "text": choice.text, "token_ids": choice.model_extra["token_ids"],
                "finish_reason": choice.finish_reason}

    prompts = args["prompts"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    return {"results": results, "max_slots_seen": metric(base_url, "onepass_slots_total")}


def cancel(base_url, args):
    c = client(base_url)
    model = model_id(base_url)
    stream = c.completions.create(model=model, prompt="Once upon a time",
                                  max_tokens=args.get("max_tokens", 400), temperature=0,
                                  stream=True)
    got = 0
    for _ in stream:
        got += 1
        if got == 3:
            break
    busy = metric(base_url, "onepass_slots_in_use")
    stream.close()
    deadline = time.time() + 20
    freed = None
    while time.time() < deadline:
        if metric(base_url, "onepass_slots_in_use") == 0:
            freed = time.time()
            break
        time.sleep(0.05)
    return {"chunks": got, "busy_before": busy, "freed": freed is not None,
            "generated": metric(base_url, "onepass_generated_tokens_total")}


def bad_requests(base_url, args):
    c = client(base_url)
    model = model_id(base_url)
    out = {}

    def status_of(name, fn):
        try:
            fn()
            out[name] = {"status": 200}
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            out[name] = {"status": e.status_code, "param": body.get("param"),
                         "type": body.get("type"), "code": body.get("code"),
                         "message": body.get("message")}

    status_of("temperature", lambda: c.completions.create(model=model, prompt="x", temperature=5))
    status_of("n", lambda: c.completions.create(model=model, prompt="x", n=2))
    status_of("max_tokens", lambda: c.completions.create(model=model, prompt="x", max_tokens=-1))
    status_of("too_many", lambda: c.completions.create(model=model, prompt="x", max_tokens=10**6))
    status_of("context", lambda: c.completions.create(model=model, prompt="x",
                                                      max_tokens=args["ctx"]))
    status_of("unknown_field", lambda: c.completions.create(model=model, prompt="x",
                                                            extra_body={"bogus": 1}))
    status_of("model", lambda: c.completions.create(model="no-such-model", prompt="x"))
    status_of("messages", lambda: c.chat.completions.create(model=model, messages=[]))
    status_of("role", lambda: c.chat.completions.create(
        model=model, messages=[{"role": "wizard", "content": "x"}]))
    out["malformed"] = post_raw(base_url, "/v1/completions", b'{"model": ')
    out["not_object"] = post_raw(base_url, "/v1/completions", b"[1]")
    out["too_large"] = post_raw(base_url, "/v1/completions",
                                b'{"model": "m", "prompt": "' + b"a" * (2 << 20) + b'"}')
    out["token_range"] = post_raw(base_url, "/v1/completions",
                                  json.dumps({"model": model, "prompt": [10**9]}).encode())
    return out


def auth(base_url, args):
    out = {}
    for name, key in [("missing", None), ("wrong", "nope"), ("right", args["key"])]:
        headers = {} if key is None else {"Authorization": "Bearer " + key}
        status, body = post_raw(base_url, "/v1/completions",
                                json.dumps({"model": args["model"], "prompt": "Hi",
                                            "max_tokens": 1}).encode(), headers)
        out[name] = {"status": status, "type": body.get("error", {}).get("type")}
    with urllib.request.urlopen(base_url + "/health", timeout=10) as r:
        out["health"] = r.status
    return out


def queue_full(base_url, args):
    """With one slot and a queue of one: a running stream, a queued one, then a 429."""
    c = client(base_url)
    model = model_id(base_url)
    n = args.get("max_tokens", 200)
    first = c.completions.create(model=model, prompt="Once upon a time", max_tokens=n,
                                 temperature=0, stream=True)
    next(iter(first))
    second = c.completions.create(model=model, prompt="Once upon a time", max_tokens=n,
                                  temperature=0, stream=True)
    deadline = time.time() + 20
    while metric(base_url, "onepass_queue_length") < 1 and time.time() < deadline:
        time.sleep(0.02)
    out = {"queued": metric(base_url, "onepass_queue_length")}
    try:
        c.completions.create(model=model, prompt="x", max_tokens=2)
        out["third"] = {"status": 200}
    except openai.RateLimitError as e:
        out["third"] = {"status": e.status_code, "message": e.body.get("message")}
    except openai.APIStatusError as e:
        out["third"] = {"status": e.status_code}
    first.close()
    second.close()
    # Both slots' worth of work is gone before the test goes on.
    deadline = time.time() + 20
    while time.time() < deadline and (metric(base_url, "onepass_queue_length") > 0
                                      or metric(base_url, "onepass_slots_in_use") > 0):
        time.sleep(0.02)
    return out


def long_stream(base_url, args):
    """Starts a stream, tells the test (a line on stdout) once text flows, and reads it to its
    end: the test sends SIGTERM meanwhile and the stream must still end cleanly."""
    c = client(base_url)
    model = model_id(base_url)
    stream = c.completions.create(model=model, prompt="Once upon a time", max_tokens=args["n"],
                                  temperature=0, stream=True)
    pieces, reasons = [], []
    for chunk in stream:
        if not pieces:
            print("streaming", flush=True)
        for choice in chunk.choices:
            pieces.append(choice.text)
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    return {"text": "".join(pieces), "finish_reasons": reasons}


SCENARIOS = {
    "basic": basic,
    "concurrent": concurrent_greedy,
    "cancel": cancel,
    "bad": bad_requests,
    "auth": auth,
    "queue_full": queue_full,
    "long_stream": long_stream,
}

if __name__ == "__main__":
    scenario, base_url = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    KEY["value"] = args.get("key", "none")
    print(json.dumps(SCENARIOS[scenario](base_url, args)), flush=True)
