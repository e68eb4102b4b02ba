// The SGLang Omni playground. It talks to this server's public API only: GET /v1/models,
// /server_info, /health and /v1/queue; POST /v1/chat/completions (streaming, with progress) on the
// interleaved and text-only pipelines; the image, video and action routes on direct generation.
"use strict";

const KEY_STORAGE = "sgl-omni-api-key";
const $ = (id) => document.getElementById(id);
const state = { mode: null, model: null, info: {}, history: [], attachments: [],
                controller: null, videoJob: null, question: null,
                // direct generation: every video job seen, the newest answer about each wins
                jobs: new Map(), asked: 0, jobStarted: new Map(), deleted: new Set() };
// The text-only page's max_tokens unless the user sets another (without it the Reasoner may
// decode up to its context length).
const CHAT_MAX_TOKENS = 256;
// Prompts the empty conversation offers, by pipeline mode; clicking one fills the prompt.
const EXAMPLES = {
  umm: ["Draw a red cube, then describe it.",
        "Make a short video of a ball rolling down a hill, then say what happens in it.",
        "Generate an image of a sunset over the sea, then name its colours."],
  chat: ["What is in a red cube?", "Explain in two sentences what a diffusion model does.",
         "Write a haiku about a video that loops."],
};
// With the scripted engines (make serve-demo) the Reasoner follows a script in the prompt
// (docs/scripted-engines.md): these examples carry one, so they make what they say.
const script = (entries, text) => `<omni-script>${JSON.stringify(entries)}</omni-script> ${text}`;
const SCRIPTED_EXAMPLES = {
  umm: [script([{ action: "image", prompt: "a red cube" },
                { action: "final", text: "Here is a red cube (a scripted test pattern)." }],
               "Draw a red cube, then describe it."),
        script([{ action: "video", prompt: "a ball rolling down a hill" },
                { action: "final", text: "A ball rolls down a hill (a scripted test pattern)." }],
               "Make a short video of a ball rolling down a hill, then say what happens in it."),
        script([{ action: "final", text: "The conversation so far holds {media}." }],
               "Which images and videos have you seen?")],
};

// --- the API key, asked for when the server answers 401, kept in this tab only ---------------
function apiKey() { return sessionStorage.getItem(KEY_STORAGE); }

function askForKey(message) {
  return new Promise((resolve) => {
    const dialog = $("key-dialog");
    $("key-error").hidden = !message;
    $("key-error").textContent = message || "";
    $("key-input").value = "";
    $("key-form").onsubmit = (event) => {
      event.preventDefault();
      const key = $("key-input").value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY_STORAGE, key);
      $("key-note").hidden = false;
      dialog.close();
      resolve(key);
    };
    if (!dialog.open) dialog.showModal();
  });
}

// fetch with the key; a 401 asks for the key and tries again.
async function api(path, options = {}) {
  for (let attempt = 0; ; attempt++) {
    const headers = new Headers(options.headers || {});
    const key = apiKey();
    if (key) headers.set("Authorization", `Bearer ${key}`);
    const response = await fetch(path, { ...options, headers });
    if (response.status !== 401 || attempt > 3) return response;
    const body = await response.json().catch(() => ({}));
    await askForKey(key ? (body.error && body.error.message) || "the key was refused" : "");
  }
}

async function errorText(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    if (body.error && body.error.message) return `${response.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${response.status}: ${text.slice(0, 500)}`;
}

function showError(id, message) {
  const box = $(id);
  box.hidden = !message;
  box.textContent = message || "";
}

// --- server-sent events over fetch ----------------------------------------------------------
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (!data.length) continue; // a keep-alive comment
      const text = data.join("\n");
      yield { event, data: text === "[DONE]" ? text : JSON.parse(text) };
    }
  }
}

// --- media ---------------------------------------------------------------------------------
function dataUrlBlob(url) {
  const comma = url.indexOf(",");
  const mime = url.slice(5, url.indexOf(";"));
  const raw = atob(url.slice(comma + 1));
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return new Blob([bytes], { type: mime });
}

function humanBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(2)} MiB`;
}

// A figure for an image or video: the player, its sha256 and size on hover and in the caption,
// and a download link.
function mediaFigure(kind, blob, sha256, name) {
  const figure = document.createElement("figure");
  const url = URL.createObjectURL(blob);
  const media = document.createElement(kind === "video" ? "video" : "img");
  media.src = url;
  if (kind === "video") { media.controls = true; media.muted = true; media.loop = true; }
  else media.alt = name;
  // its size is known once loaded: keep the conversation's end in view
  media.addEventListener(kind === "video" ? "loadedmetadata" : "load", scrollDown);
  const detail = `sha256 ${sha256}\n${blob.size} bytes (${humanBytes(blob.size)}), ${blob.type}`;
  media.title = detail;
  const caption = document.createElement("figcaption");
  caption.title = detail;
  const code = document.createElement("code");
  code.textContent = `sha256 ${sha256.slice(0, 12)}…`;
  const size = document.createElement("span");
  size.textContent = humanBytes(blob.size);
  const link = document.createElement("a");
  link.className = "download";
  link.href = url;
  link.download = name;
  link.textContent = "Download";
  caption.append(code, size, link);
  figure.append(media, caption);
  return figure;
}

// --- the conversation (interleaved pipeline and text-only chat) ------------------------------
function addTurn(role) {
  const turn = document.createElement("div");
  turn.className = `turn ${role}`;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role === "user" ? "you" : state.model || "assistant";
  turn.append(who);
  $("conversation").append(turn);
  return turn;
}

// Follow the answer as it grows, but never past the question it answers: the user's prompt
// stays in view (scroll up to see it go, or down for the rest of the answer).
function scrollDown() {
  const c = $("conversation");
  let top = c.scrollHeight - c.clientHeight;
  if (state.question && state.question.isConnected) {
    const questionTop = c.scrollTop + state.question.getBoundingClientRect().top
      - c.getBoundingClientRect().top - 4;
    top = Math.min(top, questionTop);
  }
  c.scrollTop = Math.max(0, top);
}

function examplePrompts() {
  const scripted = (state.info.engines || {}).reasoner === "scripted";
  return (scripted && SCRIPTED_EXAMPLES[state.mode]) || EXAMPLES[state.mode] || [];
}

function renderExamples() {
  const box = $("examples");
  const prompts = examplePrompts();
  box.hidden = $("conversation").children.length > 0 || !prompts.length;
  if (box.children.length > 1) return;
  for (const text of prompts) {
    const example = document.createElement("button");
    example.type = "button";
    example.className = "example secondary";
    example.append(userText(text, "span"));
    example.title = text;
    example.onclick = () => { $("prompt").value = text; $("prompt").focus(); };
    box.append(example);
  }
}

function renderSegment(turn, segment) {
  const box = document.createElement("div");
  box.className = "segment";
  box.dataset.kind = segment.kind;
  box.dataset.index = segment.segment_index;
  if (segment.kind === "text") {
    const p = document.createElement("p");
    p.textContent = segment.data;
    box.append(p);
  } else {
    const data = segment.data;
    box.dataset.sha256 = data.sha256;
    box.dataset.size = data.size_bytes;
    const ext = data.mime_type === "video/mp4" ? "mp4" : "png";
    box.append(mediaFigure(segment.kind, dataUrlBlob(data.url), data.sha256,
                           `segment-${segment.segment_index}.${ext}`));
  }
  turn.append(box);
  scrollDown();
}

// The user's text; a scripted-engine script (<omni-script>…</omni-script>) shows as a chip.
function userText(text, tag = "p") {
  const p = document.createElement(tag);
  const script = /<omni-script>[\s\S]*?<\/omni-script>/;
  const match = script.exec(text);
  if (match) {
    const chip = document.createElement("span");
    chip.className = "script-chip";
    chip.textContent = "scripted turns";
    chip.title = match[0];
    p.append(chip, text.replace(script, "").trim());
  } else {
    p.textContent = text;
  }
  return p;
}

function readFileAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function renderAttachments() {
  const box = $("attachments");
  box.replaceChildren();
  state.attachments.forEach((a, i) => {
    const chip = document.createElement("span");
    chip.className = "chip";
    chip.textContent = `${a.kind}: ${a.label}`;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "×";
    remove.onclick = () => { state.attachments.splice(i, 1); renderAttachments(); };
    chip.append(remove);
    box.append(chip);
  });
}

function kindOf(mimeOrUrl) {
  return /^video\/|\.(mp4|webm|mov|mkv)(\?|$)/i.test(mimeOrUrl) ? "video" : "image";
}

function numberField(id) {
  const raw = $(id).value.trim();
  if (raw === "") return undefined;
  const value = Number(raw);
  return Number.isNaN(value) ? raw : value;
}

function setIf(target, key, value) { if (value !== undefined) target[key] = value; }

function requestBody(messages) {
  const body = { messages, stream: true };
  if (state.mode === "umm") body.stream_options = { include_progress: true };
  setIf(body, "temperature", numberField("opt-temperature"));
  setIf(body, "top_p", numberField("opt-top-p"));
  setIf(body, "top_k", numberField("opt-top-k"));
  setIf(body, "seed", numberField("opt-sampling-seed"));
  if (state.mode === "chat") setIf(body, "max_tokens", numberField("opt-max-tokens"));
  if (state.mode === "umm") {
    const generation = {};
    setIf(generation, "width", numberField("opt-width"));
    setIf(generation, "height", numberField("opt-height"));
    setIf(generation, "num_frames", numberField("opt-frames"));
    setIf(generation, "num_inference_steps", numberField("opt-steps"));
    setIf(generation, "seed", numberField("opt-seed"));
    if (Object.keys(generation).length) body.stage_params = { generation };
  }
  return body;
}

function doneText(p, elapsed) {
  const seconds = `${elapsed.toFixed(1)} s`;
  if (!p) return `done in ${seconds}`;
  const turns = `${p.turn} Reasoner turn${p.turn === 1 ? "" : "s"}`;
  const made = p.generation || 0;
  return `done in ${seconds}: ${turns}, ${made} generation${made === 1 ? "" : "s"}`;
}

function progressText(p, elapsed) {
  const seconds = `${elapsed.toFixed(1)} s`;
  if (!p) return `waiting for the server · ${seconds}`;
  if (p.stage === "reasoner") return `Reasoner turn ${p.turn} · thinking · ${seconds}`;
  const steps = p.steps ? `step ${p.step} of ${p.steps}` : "starting";
  return `Reasoner turn ${p.turn} · ${p.modality} ${p.generation}: ${steps} · ${seconds}`;
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text && !state.attachments.length) return;
  showError("chat-error", "");
  const content = [{ type: "text", text }];
  for (const a of state.attachments) {
    const key = `${a.kind}_url`;
    content.push({ type: key, [key]: { url: a.url } });
  }
  const userTurn = addTurn("user");
  userTurn.append(userText(text));
  state.question = userTurn;
  $("examples").hidden = true;
  for (const a of state.attachments) {
    const note = document.createElement("div");
    note.className = "chip";
    note.textContent = `${a.kind}: ${a.label}`;
    userTurn.append(note);
  }
  const message = { role: "user", content: state.attachments.length ? content : text };
  const messages = [...state.history, message];
  state.attachments = [];
  renderAttachments();
  $("prompt").value = "";
  scrollDown();
  await run(messages, message);
}

async function run(messages, userMessage) {
  const controller = new AbortController();
  state.controller = controller;
  $("send").disabled = true;
  $("stop").disabled = false;
  const started = performance.now();
  let latest = null;
  let generations = 0;
  let stopped = false;
  let outcome = "done";  // or "refused" (the server said no before any work), "failed"
  const line = $("progress");
  line.hidden = false;
  const tick = setInterval(() => {
    line.textContent = progressText(latest, (performance.now() - started) / 1000);
  }, 100);
  line.textContent = progressText(null, 0);
  let assistant = null;
  let answer = "";
  let plainText = null;
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(requestBody(messages)), signal: controller.signal,
    });
    if (!response.ok) {
      outcome = "refused";
      showError("chat-error", await errorText(response));
      return;
    }
    assistant = addTurn("assistant");
    for await (const { data } of sseEvents(response)) {
      if (data === "[DONE]") break;
      if (data.error) {
        outcome = "failed";
        showError("chat-error", `${data.error.code}: ${data.error.message}`);
        break;
      }
      const delta = (data.choices && data.choices[0] && data.choices[0].delta) || {};
      if (delta.progress) {
        latest = delta.progress;
        generations = Math.max(generations, latest.generation || 0);
      }
      if (delta.segment) {
        renderSegment(assistant, delta.segment);
        if (delta.segment.kind === "text") answer += delta.segment.data;
      } else if (delta.content) {
        if (!plainText) {
          plainText = document.createElement("p");
          const box = document.createElement("div");
          box.className = "segment";
          box.dataset.kind = "text";
          box.append(plainText);
          assistant.append(box);
        }
        answer += delta.content;
        plainText.textContent = answer;
        scrollDown();
      }
    }
    state.history.push(userMessage, { role: "assistant", content: answer });
  } catch (error) {
    if (error.name === "AbortError") {
      stopped = true;
      const note = document.createElement("p");
      note.className = "notice";
      note.textContent = `Stopped after ${((performance.now() - started) / 1000).toFixed(1)} s; `
        + "the server aborted the request.";
      (assistant || addTurn("assistant")).append(note);
      note.scrollIntoView({ block: "nearest" });  // the conversation and the page
    } else {
      outcome = "failed";
      showError("chat-error", `the request failed: ${error.message}`);
    }
  } finally {
    clearInterval(tick);
    const elapsed = (performance.now() - started) / 1000;
    line.textContent = stopped ? `stopped · ${progressText(latest, elapsed)}`
      : outcome === "failed" ? `failed after ${elapsed.toFixed(1)} s`
        : state.mode === "umm" && latest ? doneText({ ...latest, generation: generations }, elapsed)
          : `done in ${elapsed.toFixed(1)} s`;
    line.hidden = outcome === "refused";  // nothing ran: the error box says why
    state.controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

function setupChat() {
  $("chat-view").hidden = false;
  if (state.mode === "chat") {
    $("generation-options").hidden = true;
    $("max-tokens-label").hidden = false;
    $("opt-max-tokens").value = String(CHAT_MAX_TOKENS);
    $("prompt").placeholder = "Ask the Reasoner (attach an image or a video to ask about it)…";
  }
  $("composer").onsubmit = send;
  renderExamples();
  $("prompt").onkeydown = (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("composer").requestSubmit();
  };
  $("stop").onclick = () => { if (state.controller) state.controller.abort(); };
  $("clear").onclick = () => {
    state.history = [];
    $("conversation").replaceChildren();
    state.question = null;
    renderExamples();
    $("progress").hidden = true;
    showError("chat-error", "");
  };
  $("attach-file").onchange = async () => {
    const file = $("attach-file").files[0];
    if (!file) return;
    state.attachments.push({ kind: kindOf(file.type), label: file.name,
                             url: await readFileAsDataUrl(file) });
    $("attach-file").value = "";
    renderAttachments();
  };
  $("attach-url-add").onclick = () => {
    const url = $("attach-url").value.trim();
    if (!url) return;
    state.attachments.push({ kind: kindOf(url), label: url, url });
    $("attach-url").value = "";
    renderAttachments();
  };
}

// --- direct generation: a form per route ---------------------------------------------------
function sizeFields(value) {
  const match = /^(\d+)x(\d+)$/.exec(value.trim());
  return match ? { width: Number(match[1]), height: Number(match[2]) } : { size: value.trim() };
}

async function showMediaResult(boxId, kind, blob, name) {
  const bytes = new Uint8Array(await blob.arrayBuffer());
  const sha = await window.sha256Hex(bytes);
  const box = $(boxId);
  const holder = document.createElement("div");
  holder.className = "segment";
  holder.dataset.kind = kind;
  holder.dataset.sha256 = sha;
  holder.append(mediaFigure(kind, blob, sha, name));
  box.prepend(holder);
}

async function generateImage(event) {
  event.preventDefault();
  showError("image-error", "");
  $("image-go").disabled = true;
  const body = { prompt: $("image-prompt").value, ...sizeFields($("image-size").value) };
  setIf(body, "num_inference_steps", numberField("image-steps"));
  setIf(body, "seed", numberField("image-seed"));
  try {
    const response = await api("/v1/images/generations", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    if (!response.ok) { showError("image-error", await errorText(response)); return; }
    const answer = await response.json();
    const blob = dataUrlBlob(`data:image/png;base64,${answer.data[0].b64_json}`);
    await showMediaResult("image-result", "image", blob, `${answer.id}.png`);
  } finally {
    $("image-go").disabled = false;
  }
}

// Every video job the page saw, by id, from one store: the status line and the side panel
// both show what it holds, and an answer replaces an entry only if it was asked for after the
// one the entry came from (a slow list poll cannot undo a "completed" seen since).
function noteJob(job, asked) {
  if (state.deleted.has(job.id)) return;
  const seen = state.jobs.get(job.id);
  if (!seen || asked > seen.asked) state.jobs.set(job.id, { asked, job });
}

function jobLine(id) {
  const seen = state.jobs.get(id);
  return seen ? `${seen.job.status}, ${seen.job.progress}%` : "…";
}

function renderJobs() {
  const jobs = $("jobs");
  jobs.replaceChildren();
  const newest = [...state.jobs.values()].map((s) => s.job)
    .sort((a, b) => b.created_at - a.created_at || (a.id < b.id ? 1 : -1)).slice(0, 8);
  for (const job of newest) {
    const li = document.createElement("li");
    li.dataset.id = job.id;
    li.textContent = `${job.id.slice(0, 10)}: ${jobLine(job.id)}`;
    jobs.append(li);
  }
  if (!jobs.children.length) jobs.textContent = "none";
}

// The video form's one state: the job it follows (its status line) and its error.
function showVideo({ job = null, error = "" }) {
  const status = $("video-status");
  status.hidden = job === null;
  if (job !== null) {
    const timing = state.jobStarted.get(job);  // { started, ended } in page time
    const seen = state.jobs.get(job);
    const running = seen && (seen.job.status === "queued" || seen.job.status === "in_progress");
    if (timing && !running && timing.ended === undefined) timing.ended = performance.now();
    const seconds = timing
      ? ` · ${(((timing.ended ?? performance.now()) - timing.started) / 1000).toFixed(1)} s` : "";
    status.textContent = `job ${job}: ${jobLine(job)}${seconds}`;
  }
  showError("video-error", error);
  renderJobs();
}

async function createVideo(event) {
  event.preventDefault();
  showVideo({});  // a new Send: the last job's line and error go
  const fields = { prompt: $("video-prompt").value, ...sizeFields($("video-size").value) };
  setIf(fields, "num_frames", numberField("video-frames"));
  setIf(fields, "fps", numberField("video-fps"));
  setIf(fields, "num_inference_steps", numberField("video-steps"));
  setIf(fields, "seed", numberField("video-seed"));
  const reference = $("video-reference").files[0];
  let options;
  if (reference) {
    const form = new FormData();
    for (const [k, v] of Object.entries(fields)) form.append(k, String(v));
    form.append("input_reference", reference);
    options = { method: "POST", body: form };
  } else {
    options = { method: "POST", headers: { "Content-Type": "application/json" },
                body: JSON.stringify(fields) };
  }
  $("video-go").disabled = true;
  const asked = ++state.asked;
  const response = await api("/v1/videos", options);
  if (!response.ok) {
    showVideo({ error: await errorText(response) });
    $("video-go").disabled = false;
    return;
  }
  const created = await response.json();
  noteJob(created, asked);
  const id = created.id;
  state.videoJob = id;
  state.jobStarted.set(id, { started: performance.now() });
  $("video-stop").disabled = false;
  try {
    for (;;) {
      const polledAt = ++state.asked;
      const polled = await api(`/v1/videos/${id}`);
      if (state.videoJob !== id) return;  // stopped (and deleted) meanwhile
      if (!polled.ok) { showVideo({ job: id, error: await errorText(polled) }); return; }
      noteJob(await polled.json(), polledAt);
      const now = state.jobs.get(id).job;
      showVideo({ job: id });
      if (now.status === "failed") {
        showVideo({ job: id, error: (now.error && now.error.message) || "failed" });
        return;
      }
      if (now.status === "completed") {
        const content = await api(`/v1/videos/${id}/content`);
        if (!content.ok) { showVideo({ job: id, error: await errorText(content) }); return; }
        await showMediaResult("video-result", "video", await content.blob(), `${id}.mp4`);
        return;
      }
      await new Promise((r) => setTimeout(r, 400));
    }
  } finally {
    if (state.videoJob === id) state.videoJob = null;
    $("video-go").disabled = false;
    $("video-stop").disabled = true;
  }
}

async function stopVideo() {
  const id = state.videoJob;
  if (!id) return;
  state.videoJob = null;
  const response = await api(`/v1/videos/${id}`, { method: "DELETE" });
  if (response.ok) {
    state.deleted.add(id);
    state.jobs.delete(id);
    showVideo({});
    const status = $("video-status");
    status.hidden = false;
    status.textContent = `job ${id}: stopped and deleted`;
  } else {
    showVideo({ job: id, error: await errorText(response) });
  }
}

async function generateAction(event) {
  event.preventDefault();
  showError("action-error", "");
  let body;
  try { body = JSON.parse($("action-body").value); } catch (error) {
    showError("action-error", `not valid JSON: ${error.message}`);
    return;
  }
  $("action-go").disabled = true;
  try {
    const response = await api("/v1/actions/generations", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    if (!response.ok) { showError("action-error", await errorText(response)); return; }
    $("action-result").textContent = JSON.stringify(await response.json(), null, 2);
  } finally {
    $("action-go").disabled = false;
  }
}

function setupDirect() {
  $("direct-view").hidden = false;
  $("jobs-box").hidden = false;
  $("action-body").value = JSON.stringify({
    task: "put the cup in the sink", domain_name: "droid_lerobot", raw_action_dim: 8,
    num_inference_steps: 4, seed: 7 }, null, 2);
  for (const tab of document.querySelectorAll(".tab")) {
    tab.onclick = () => {
      for (const t of document.querySelectorAll(".tab")) t.classList.toggle("active", t === tab);
      for (const panel of document.querySelectorAll(".tab-panel")) {
        panel.hidden = panel.dataset.panel !== tab.dataset.tab;
      }
    };
  }
  // a failed call (the server gone) shows in the form's error box
  const shown = (handler, box) => (event) => handler(event).catch(
    (error) => showError(box, `the request failed: ${error.message}`));
  // a Send the browser refuses (a field out of its pattern) says why itself: no older error
  for (const [form, box] of [["image-form", "image-error"], ["video-form", "video-error"],
                             ["action-form", "action-error"]]) {
    $(form).addEventListener("invalid", () => showError(box, ""), true);
  }
  $("image-form").onsubmit = shown(generateImage, "image-error");
  $("video-form").onsubmit = shown(createVideo, "video-error");
  $("video-stop").onclick = shown(stopVideo, "video-error");
  $("video-reference").onchange = () => {
    const file = $("video-reference").files[0];
    $("video-reference-name").textContent = file ? file.name : "";
  };
  $("action-form").onsubmit = shown(generateAction, "action-error");
}

// --- the server panel ----------------------------------------------------------------------
async function pollHealth() {
  try {
    const response = await fetch("/health");
    const body = await response.json();
    const badge = $("health-status");
    badge.textContent = body.status;
    badge.className = `badge ${body.status}`;
    const stages = $("stages");
    stages.replaceChildren();
    for (const [name, s] of Object.entries(body.stages || {})) {
      const li = document.createElement("li");
      li.textContent = `${name}: ${s.status}${s.restarts ? `, ${s.restarts} restart(s)` : ""}`;
      stages.append(li);
    }
  } catch (_) {
    $("health-status").textContent = "down";
    $("health-status").className = "badge down";
  }
}

const GENS_HELP = "generations made so far, and at most how many more its plan allows";
const FINISH_HELP = "the planned worst case: when the request ends if it uses every generation "
  + "allowed at the longest measured times (most finish much sooner)";

function seconds(value) { return value === null || value === undefined ? "–" : `${value.toFixed(1)} s`; }

async function pollQueue() {
  const response = await api("/v1/queue");
  if (!response.ok) return;
  const q = await response.json();
  const box = $("queue");
  box.replaceChildren();
  const summary = document.createElement("div");
  summary.textContent = `${q.active} of ${q.max_active} running · ${q.queued_generations} `
    + "generation(s) queued";
  box.append(summary);
  if (q.plan.length) {
    const table = document.createElement("table");
    table.className = "plan";
    table.innerHTML = "<tr><th>request</th><th>phase</th>"
      + `<th title="${GENS_HELP}">generations</th><th title="${FINISH_HELP}">latest finish</th></tr>`;
    for (const p of q.plan) {
      const row = table.insertRow();
      row.insertCell().textContent = p.rid.slice(0, 10);
      row.insertCell().textContent = p.phase;
      const gens = row.insertCell();
      gens.textContent = `${p.used} made, ≤ ${p.allowance} more`;
      gens.title = GENS_HELP;
      const finish = row.insertCell();
      finish.textContent = p.finish_in_s === null || p.finish_in_s === undefined ? "not planned yet"
        : `by ${seconds(p.finish_in_s)} from now`;
      finish.title = FINISH_HELP;
    }
    box.append(table);
    const legend = document.createElement("div");
    legend.className = "small legend";
    legend.textContent = `generations: ${GENS_HELP}. latest finish: ${FINISH_HELP}.`;
    box.append(legend);
  }
  const m = q.measured;
  const times = document.createElement("div");
  times.className = "small";
  const longest = Object.entries(m.longest_s).map(([k, v]) => `${k} ${seconds(v)}`).join(", ");
  times.textContent = `measured: Reasoner turn ${seconds(m.reasoner_s)}`
    + (longest ? `; longest ${longest}` : "; no generation yet");
  box.append(times);
}

async function pollJobs() {
  const asked = ++state.asked;
  const response = await api("/v1/videos");
  if (!response.ok) return;
  const list = await response.json();
  const held = new Set((list.data || []).map((job) => job.id));
  for (const id of [...state.jobs.keys()]) {
    if (!held.has(id) && state.jobs.get(id).asked < asked) state.jobs.delete(id);  // gone
  }
  for (const job of list.data || []) noteJob(job, asked);
  renderJobs();
  if (state.videoJob) showVideo({ job: state.videoJob });
}

function startPolling() {
  const quietly = (promise) => promise.catch(() => { /* the server is away: health says so */ });
  const poll = () => {
    pollHealth();
    if (state.mode === "umm") quietly(pollQueue());
    if (state.mode === "generation") quietly(pollJobs());
  };
  poll();
  setInterval(poll, 2000);
}

// --- start ---------------------------------------------------------------------------------
async function main() {
  $("key-note").hidden = !apiKey();
  $("key-forget").onclick = () => { sessionStorage.removeItem(KEY_STORAGE); $("key-note").hidden = true; };
  pollHealth();
  const response = await api("/v1/models");
  if (!response.ok) { $("model-line").textContent = await errorText(response); return; }
  const card = (await response.json()).data[0];
  state.mode = card.mode;
  state.model = card.id;
  const names = { umm: "interleaved understanding and generation", chat: "text-only chat",
                  generation: "direct generation" };
  // the served model name (what a client sends as "model"), then the pipeline class apart
  const unnamed = card.id === card.pipeline ? " (the pipeline's name: --model-name sets one)" : "";
  $("model-line").textContent = `model ${card.id}${unnamed} · ${names[card.mode] || card.mode}`
    + ` · pipeline ${card.pipeline}`;
  document.body.dataset.mode = card.mode;
  $("queue-box").hidden = card.mode !== "umm";
  await showNotices();
  if (card.mode === "generation") setupDirect(); else setupChat();
  startPolling();
  document.body.dataset.ready = "1";
}

function sentence(text) { return text.charAt(0).toUpperCase() + text.slice(1) + "."; }

// What the server says of itself (/server_info) above everything: a checkpoint built with
// random weights (sgl-omni make-checkpoint, the demo) makes noise and gibberish; the scripted
// engines (make serve-demo, the tests) run no model at all.
async function showNotices() {
  const response = await api("/server_info");
  if (!response.ok) return;
  const info = await response.json();
  state.info = info;
  const weights = $("weights-notice");
  weights.hidden = !info.random_weights;
  weights.textContent = info.random_weights ? sentence(info.notice) : "";
  const scripted = $("scripted-notice");
  scripted.hidden = !info.scripted;
  scripted.textContent = info.scripted ? sentence(info.scripted_notice) : "";
}

main();
