"""The validation Job's built-in script: POSIX sh and awk, the reading of each tool's
output as gpuheal/policy/validation_output.py reads it.

Why awk and not a JSON tool: the Job runs DCGM's image (nvcr.io/nvidia/cloud-native/dcgm,
Ubuntu or UBI) or one a pool names, and neither need have Python or jq; every one has
/bin/sh and awk (mawk on Ubuntu, gawk on UBI, busybox's elsewhere). Matching the text
with grep cannot be made right: dcgmi's JSON is jsoncpp's styled output (one key a
line, but an object on the line after its key), its status key is lower case, and a
failure's meaning is in which result it is, for which GPU. So the script carries a
small JSON reader in awk (no gawk extensions; run with LC_ALL=C, so it counts bytes)
and applies the same rules as the Python reader, which the unit tests hold it to over
the fixtures in tests/unit/data/validation/ (real output, built from the tools' code).

What it checks, in order (docs/operations.md, "Validation"):

1. the container sees every GPU the Job asked for (GPUHEAL_GPUS, the count its limits
   request): the /dev/nvidia<N> device nodes, which the NVIDIA container runtime
   (legacy hook or CDI) creates for each GPU the device plugin gave the container.
   They need no tool: nvidia-smi is mounted only into images that ask for the driver's
   "utility" capability (DCGM's does, a pool's own image may not), and dcgmi's own list
   of GPUs is checked in step 2, after the diagnostic has run;
2. `dcgmi diag -r <level> -j`: its JSON, not its exit code alone (DCGM 3.x exits 0 for
   a WARN it writes "Fail"; 4.x exits 0 for a CPU's failure, 226 for a passing test
   that recorded an error): any "fail" of any test or entity fails, a "warn" is said
   and fails only with GPUHEAL_FAIL_ON_WARN=1, skips are said, fewer GPUs in the JSON
   than asked for fail, and so do no JSON, a runtime_error, or a non-zero exit;
3. on a multi-GPU node with a threshold, nccl-tests' `all_reduce_perf`: its "# Avg bus
   bandwidth" line (a number, at least the threshold), its "# Out of bounds values"
   line and `#wrong` cells (none), its exit code (0).

It writes {"result", "tool", "detail"} to the termination message (policy/validation.py
reads it), and the same line to its log.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuheal.policy.validation_output import (
    DCGMI_EXITS,
    DEPTH_MAX,
    DETAIL_MAX,
    MESSAGE_SHOWN,
    NCCL_EXITS,
    SKIPS_SHOWN,
    TESTS_SHOWN,
)


def _exits(names: Mapping[int, str]) -> str:
    return "; ".join(f'EXITS[{code}] = "{name}"' for code, name in sorted(names.items()))


def _fill(program: str, exits: Mapping[int, str]) -> str:
    return (
        program.replace("@EXITS@", _exits(exits))
        .replace("@SHOWN@", str(MESSAGE_SHOWN))
        .replace("@TESTS@", str(TESTS_SHOWN))
        .replace("@SKIPS@", str(SKIPS_SHOWN))
        .replace("@DEPTH@", str(DEPTH_MAX))
        .replace("@MAX@", str(DETAIL_MAX))
    )


DCGMI_AWK = _fill(
    r"""# The reader of dcgmi diag -j (rules and their reasons: gpuheal/policy/validation_output.py,
# which reads the same way). POSIX awk, run with LC_ALL=C; args: the stdout, then the
# stderr of dcgmi; -v level, want (GPUs), rc (its exit code), failwarn (1: a warn fails).
# Prints one line: "pass <detail>" or "fail <detail>".
function clip(t, lim) { return length(t) <= lim ? t : substr(t, 1, lim - 3) "..." }
function line1(t,   k, c, out) {
	out = ""
	for (k = 1; k <= length(t); k++) { c = substr(t, k, 1); out = out (index(CTRL, c) ? " " : c) }
	return said(out)
}
function trim(t) { sub(/^ +/, "", t); sub(/ +$/, "", t); return t }
function said(t) { gsub(/ +/, " ", t); return trim(t) }
function hexval(h,   k, v) {
	v = 0
	for (k = 1; k <= length(h); k++) v = v * 16 + index("0123456789abcdef", substr(h, k, 1)) - 1
	return v
}
# A JSON string at s[i] (its opening quote), decoded as validation_output.said keeps
# it: \t \n \r \f \b as spaces, other controls and non-ASCII as \uXXXX (lower case).
function str(   out, c, e, h, v, start) {
	i++; out = ""; start = i
	while (i <= n) {
		c = substr(s, i, 1)
		if (c == "\"") { out = out substr(s, start, i - start); i++; return out }
		if (index(CTRL, c)) { ok = 0; return out }
		if (c != "\\") { i++; continue }
		out = out substr(s, start, i - start)
		e = substr(s, i + 1, 1)
		if (e == "\"" || e == "\\" || e == "/") out = out e
		else if (e == "b" || e == "f" || e == "n" || e == "r" || e == "t") out = out " "
		else if (e == "u") {
			h = tolower(substr(s, i + 2, 4))
			if (h !~ /^[0-9a-f][0-9a-f][0-9a-f][0-9a-f]$/) { ok = 0; return out }
			v = hexval(h)
			if (v == 8 || v == 9 || v == 10 || v == 12 || v == 13) out = out " "
			else if (v >= 32 && v < 128) out = out sprintf("%c", v)
			else out = out "\\u" h
			i += 4
		} else { ok = 0; return out }
		i += 2; start = i
	}
	ok = 0; return out
}
function ws(   c) {
	while (i <= n) {
		c = substr(s, i, 1)
		if (c == " " || c == "\t" || c == "\n" || c == "\r") i++; else return
	}
}
function seen(path, t) { if (!(path in typ)) order[++np] = path; typ[path] = t }
function value(path, depth,   c, k, idx, t) {
	if (depth > DEPTH) { ok = 0; return }
	ws(); c = substr(s, i, 1)
	if (c == "{") {
		seen(path, "o"); i++; ws()
		if (substr(s, i, 1) == "}") { i++; return }
		while (ok) {
			ws()
			if (substr(s, i, 1) != "\"") { ok = 0; return }
			k = str(); if (!ok) return
			k = tolower(trim(k)); gsub(/\//, "%2f", k)
			ws()
			if (substr(s, i, 1) != ":") { ok = 0; return }
			i++
			value(path "/" k, depth + 1); if (!ok) return
			ws(); c = substr(s, i, 1); i++
			if (c == "}") return
			if (c != ",") { ok = 0; return }
		}
		return
	}
	if (c == "[") {
		seen(path, "a"); i++; ws(); idx = 0; size[path] = 0
		if (substr(s, i, 1) == "]") { i++; return }
		while (ok) {
			value(path "/#" idx, depth + 1); idx++; size[path] = idx
			if (!ok) return
			ws(); c = substr(s, i, 1); i++
			if (c == "]") return
			if (c != ",") { ok = 0; return }
		}
		return
	}
	if (c == "\"") { t = str(); if (ok) { seen(path, "s"); val[path] = t }; return }
	t = substr(s, i, 5)
	if (t == "false") { seen(path, "s"); val[path] = t; i += 5; return }
	t = substr(t, 1, 4)
	if (t == "true" || t == "null") { seen(path, "s"); val[path] = t; i += 4; return }
	if (match(substr(s, i, 400), /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/)) {
		seen(path, "s"); val[path] = substr(s, i, RLENGTH); i += RLENGTH; return
	}
	ok = 0
}
function scalar(path) { return typ[path] == "s" }
function add(t) { if (t != "") problems = problems (problems == "" ? "" : "; ") t }
function outcome(st,   w) {
	w = tolower(trim(st))
	if (w ~ /^pass/) return "pass"
	if (w ~ /^fail/) return "fail"
	if (w ~ /^skip/) return "skip"
	if (w ~ /^warn/) return "warn"
	if (w ~ /^not run/ || w ~ /^notrun/ || w ~ /^not_run/) return "notrun"
	return "fail"
}
function exitsaid(code) { return "exited " code (code in EXITS ? " (" EXITS[code] ")" : "") }
# One result (of an entity, or the test_summary) at path q of test number tn.
function result(q, tn, summary,   st, g, e, w, j, it, m, k, key) {
	st = val[q "/status"]
	nr++; rtest[nr] = tn; rsum[nr] = summary; rstatus[nr] = st; rout[nr] = outcome(st)
	rent[nr] = ""; rmsg[nr] = ""
	if (scalar(q "/entity_group")) {
		g = val[q "/entity_group"]; e = scalar(q "/entity_id") ? val[q "/entity_id"] : ""
		rent[nr] = trim(said(g) " " said(e))
		if (tolower(trim(g)) == "gpu" && scalar(q "/entity_id")) gpu[e] = 1
	} else if (scalar(q "/gpu_id")) {
		rent[nr] = "GPU " said(val[q "/gpu_id"]); gpu[val[q "/gpu_id"]] = 1
	}
	w = q "/warnings"
	if (typ[w] != "a") return
	for (j = 0; j < size[w] && rmsg[nr] == ""; j++) {
		it = w "/#" j; m = ""
		if (typ[it] == "o") {
			for (k = 1; k <= 2; k++) {
				key = it (k == 1 ? "/warning" : "/warnings")
				if (scalar(key)) { m = said(val[key]); break }
			}
		} else if (scalar(it)) m = said(val[it])
		rmsg[nr] = m
	}
}
# "<test> failed on GPU 3, GPU 5: <message>" for each test with a result of kind.
function tests(kind, verb,   t, r, k, pass2, ents, msg, unk, hasunk, text, count, out, e) {
	count = 0; out = ""
	for (t = 1; t <= nt; t++) {
		ents = ""; msg = ""; unk = ""; hasunk = 0; split("", has)
		k = 0
		for (pass2 = 0; pass2 <= 1; pass2++)
			for (r = 1; r <= nr; r++) {
				if (rtest[r] != t || rsum[r] != pass2 || rout[r] != kind) continue
				k++
				e = rent[r]
				if (e != "" && !(e in has)) { has[e] = 1; ents = ents (ents == "" ? "" : ", ") e }
				if (msg == "" && rmsg[r] != "") msg = rmsg[r]
				if (!hasunk && index(tolower(trim(rstatus[r])), kind) != 1) {
					unk = rstatus[r]; hasunk = 1
				}
			}
		if (!k) continue
		if (msg == "" && hasunk) msg = "status \"" said(unk) "\""
		text = (tname[t] == "" ? "a test" : tname[t]) " " verb
		if (ents != "") text = text " on " ents
		if (msg != "") text = text ": " clip(msg, SHOWN)
		count++
		if (count <= TESTS) out = out (out == "" ? "" : "; ") text
	}
	if (count > TESTS) out = out "; and " (count - TESTS) " more " verb
	return out
}
BEGIN {
	for (k = 1; k < 32; k++) CTRL = CTRL sprintf("%c", k)
	@EXITS@
	SHOWN = @SHOWN@; TESTS = @TESTS@; SKIPS = @SKIPS@; DEPTH = @DEPTH@; MAX = @MAX@
}
FILENAME == ARGV[1] { s = s $0 "\n"; next }
{ if (!haveerr && $0 ~ /[^ \t\r]/) { errline = clip(line1($0), SHOWN); haveerr = 1 } }
END {
	head = "dcgmi diag -r " level; ran = head " " exitsaid(rc)
	n = length(s); i = index(s, "{")
	if (i == 0) {
		line = ""; m = split(s, lines, "\n")
		for (k = 1; k <= m; k++)
			if (lines[k] ~ /[^ \t\r]/) { line = clip(line1(lines[k]), SHOWN); break }
		if (line == "") line = errline
		print "fail " clip(line == "" ? ran " without output" : ran " without JSON: " line, MAX)
		exit
	}
	ok = 1; np = 0
	value("", 1)
	if (!ok) { print "fail " clip(ran "; its JSON is cut short or malformed", MAX); exit }
	root = ""
	for (k = 1; k <= np && root == ""; k++)
		if (order[k] == "/dcgm gpu diagnostic" || order[k] == "/dcgm diagnostic") root = order[k]
	if (root == "" || typ[root] != "o") {
		print "fail " clip(ran "; its JSON has no \"DCGM Diagnostic\" object", MAX); exit
	}
	if (scalar(root "/runtime_error") && said(val[root "/runtime_error"]) != "") {
		print "fail " clip(ran ": " clip(said(val[root "/runtime_error"]), 2 * SHOWN), MAX); exit
	}
	pre = root "/test_categories/"; nt = 0; nr = 0
	for (k = 1; k <= np; k++) {
		p = order[k]
		if (substr(p, 1, length(pre)) != pre) continue
		rest = substr(p, length(pre) + 1)
		if (rest !~ /^#[0-9]+\/tests\/#[0-9]+\/(results\/#[0-9]+|test_summary)\/status$/) continue
		if (!scalar(p)) continue
		q = substr(p, 1, length(p) - 7)
		tp = q; sub(/\/(results\/#[0-9]+|test_summary)$/, "", tp)
		if (!(tp in tnum)) {
			tnum[tp] = ++nt
			tname[nt] = scalar(tp "/name") ? said(val[tp "/name"]) : ""
		}
		result(q, tnum[tp], q ~ /\/test_summary$/ ? 1 : 0)
	}
	# The GPUs it ran on (validation_output._gpus_listed).
	if (typ["/gpu device serials"] == "o")
		for (k = 1; k <= np; k++)
			if (index(order[k], "/gpu device serials/") == 1) {
				key = substr(order[k], 21)
				if (index(key, "/") == 0) gpu[key] = 1
			}
	if (typ["/entity_groups"] == "a")
		for (g = 0; g < size["/entity_groups"]; g++) {
			G = "/entity_groups/#" g
			if (typ[G] != "o" || !scalar(G "/entity_group")) continue
			if (tolower(trim(val[G "/entity_group"])) != "gpu") continue
			E = G "/entities"
			if (typ[E] != "a") continue
			for (e = 0; e < size[E]; e++) {
				id = E "/#" e "/entity_id"
				if (typ[E "/#" e] == "o" && scalar(id)) gpu[val[id]] = 1
			}
		}
	ngpu = 0; for (k in gpu) ngpu++
	ids = "/gpu device ids"
	if (typ[ids] == "a" && size[ids] > ngpu) ngpu = size[ids]
	problems = ""
	add(tests("fail", "failed"))
	if (failwarn == 1) add(tests("warn", "warned"))
	if (ngpu < want + 0) add("it ran on " ngpu " of " want " GPUs")
	passed = 0
	for (t = 1; t <= nt; t++)
		for (r = 1; r <= nr; r++)
			if (rtest[r] == t && rout[r] == "pass") { passed++; break }
	if (nr == 0) add("its JSON has no test results")
	else if (passed == 0) add("no test passed")
	if (rc != 0 && problems == "") {
		problems = "no result in its JSON failed"
		found = ""
		for (t = 1; t <= nt && found == ""; t++)
			for (pass2 = 0; pass2 <= 1 && found == ""; pass2++)
				for (r = 1; r <= nr && found == ""; r++)
					if (rtest[r] == t && rsum[r] == pass2 && rmsg[r] != "") found = rmsg[r]
		if (found != "") problems = problems "; it reported: " clip(found, SHOWN)
	}
	if (problems != "") { print "fail " clip(ran ": " problems, MAX); exit }
	detail = head " passed on " ngpu " GPUs: " passed " test" (passed == 1 ? "" : "s")
	skipped = ""; ns = 0
	for (t = 1; t <= nt; t++)
		for (r = 1; r <= nr; r++)
			if (rtest[r] == t && rout[r] == "skip") {
				ns++
				name = tname[t] == "" ? "a test" : tname[t]
				if (ns <= SKIPS) skipped = skipped (skipped == "" ? "" : ", ") name
				break
			}
	if (ns > SKIPS) skipped = skipped ", " (ns - SKIPS) " more"
	if (skipped != "") detail = detail "; skipped: " skipped
	w = tests("warn", "warned")
	if (w != "") detail = detail "; " w
	print "pass " clip(detail, MAX)
}
""",
    DCGMI_EXITS,
)

NCCL_AWK = _fill(
    r"""# The reader of all_reduce_perf (the rules, and why: gpuheal/policy/validation_output.py).
# POSIX awk, run with LC_ALL=C; args: its stdout, then its stderr; -v gpus, min (GB/s),
# rc (its exit code). Prints one line: "pass <detail>" or "fail <detail>".
function clip(t, lim) { return length(t) <= lim ? t : substr(t, 1, lim - 3) "..." }
function line1(t,   k, c, out) {
	out = ""
	for (k = 1; k <= length(t); k++) { c = substr(t, k, 1); out = out (index(CTRL, c) ? " " : c) }
	gsub(/ +/, " ", out); sub(/^ /, "", out); sub(/ $/, "", out)
	return out
}
function header(m,   j) { for (j = 1; j <= m; j++) if (f[j] == "#wrong") return 1; return 0 }
function add(t) { if (t != "") problems = problems (problems == "" ? "" : "; ") t }
function number(t) { return t ~ /^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/ }
function aftercolon(t,   f, m) {
	sub(/^[^:]*:/, "", t); m = split(t, f, " ")
	word1 = m >= 1 ? f[1] : ""; word2 = m >= 2 ? f[2] : ""
}
BEGIN {
	for (k = 1; k < 32; k++) CTRL = CTRL sprintf("%c", k)
	@EXITS@
	SHOWN = @SHOWN@; MAX = @MAX@
	ERRORS = "Test (NCCL|CUDA) failure|Test timeout|^# error: |Invalid number of GPUs| NCCL WARN "
	havebw = 0; haveoob = 0; ncol = 0; nwrong = 0; err = ""; trace = ""
}
{
	line = $0; sub(/\r$/, "", line)
	m = split(line, f, " ")
	if (line ~ /^#[ \t]*Avg bus bandwidth[ \t]*:/) {
		aftercolon(line); havebw = 1; bw = word1; bwcheck = word2
	} else if (line ~ /^#[ \t]*Out of bounds values[ \t]*:/) {
		aftercolon(line); haveoob = 1; oob = word1; oobcheck = word2
	}
	else if (substr(line, 1, 1) == "#" && header(m)) {
		shift = f[1] == "#" ? 1 : 0; ncol = 0
		for (j = 1; j <= m; j++) if (f[j] == "#wrong") col[++ncol] = j - shift
	} else if (substr(line, 1, 1) != "#" && m > 0 && f[1] ~ /^[0-9]+$/ && ncol > 0) {
		for (j = 1; j <= ncol; j++) {
			cell = col[j] <= m ? f[col[j]] : ""
			if (number(cell) && cell + 0 > 0) {
				nwrong++; wsize[nwrong] = f[1]; wcount[nwrong] = cell
			}
		}
	}
	if (err == "" && line ~ ERRORS) err = clip(line1(line), SHOWN)
	else if (trace == "" && line ~ /Test failure/) trace = clip(line1(line), SHOWN)
}
END {
	head = "all_reduce_perf -g " gpus
	if (!number(min)) {
		print "fail " clip(head ": its threshold \"" line1(min) "\" is not a number", MAX); exit
	}
	problems = ""
	if (haveoob && (oob != "0" || oobcheck == "FAILED"))
		add(oob " out-of-bounds values (wrong results)")
	for (j = 1; j <= nwrong && j <= 3; j++) add(wcount[j] " wrong elements at " wsize[j] " B")
	if (!havebw) add("no \"# Avg bus bandwidth\" line in its output")
	else if (!number(bw)) add("its average bus bandwidth is \"" line1(bw) "\", not a number")
	else {
		if (bw + 0 < min + 0) add("bus bandwidth " bw " GB/s, below " min " GB/s")
		if (bwcheck == "FAILED") add("below NCCL_TESTS_MIN_BW by its own check")
	}
	if (rc != 0 || problems != "") {
		if (problems == "") problems = "no failure in its output"
		if (err == "") err = trace
		if (err != "") problems = problems "; it said: " err
		ran = head " exited " rc (rc in EXITS ? " (" EXITS[rc] ")" : "")
		print "fail " clip(ran ": " problems, MAX)
		exit
	}
	print "pass " head ": bus bandwidth " bw " GB/s (at least " min "), no wrong results"
}
""",
    NCCL_EXITS,
)

# The termination message: one JSON object, its strings escaped (a tool's message may
# hold quotes and backslashes: the old printf into JSON made them unreadable). Lines:
# result, tool, then the detail.
ESCAPE_AWK = r"""function esc(t,   k, c, out) {
	out = ""
	for (k = 1; k <= length(t); k++) {
		c = substr(t, k, 1)
		if (c == "\\") out = out "\\\\"
		else if (c == "\"") out = out "\\\""
		else if (index(CTRL, c)) out = out " "
		else out = out c
	}
	return out
}
BEGIN { for (k = 1; k < 32; k++) CTRL = CTRL sprintf("%c", k) }
NR == 1 { result = $0; next }
NR == 2 { tool = $0; next }
{ detail = detail (NR > 3 ? " " : "") $0 }
END {
	if (length(detail) > @MAX@) detail = substr(detail, 1, @MAX@ - 3) "..."
	printf "{\"result\":\"%s\",\"tool\":\"%s\",", esc(result), esc(tool)
	printf "\"detail\":\"%s\"}", esc(detail)
}
""".replace("@MAX@", str(DETAIL_MAX))

# GPUHEAL_RESULT_FILE and GPUHEAL_DEVICE_DIR exist for the tests, which run this script
# with fake tools; in the Job they are unset.
SCRIPT = r"""set -u
result_file=${GPUHEAL_RESULT_FILE:-/dev/termination-log}
devices=${GPUHEAL_DEVICE_DIR:-/dev}
level=${GPUHEAL_DCGM_LEVEL:-2}
want=${GPUHEAL_GPUS:-0}
min=${GPUHEAL_NCCL_MIN_BUSBW_GBPS:-0}
failwarn=${GPUHEAL_FAIL_ON_WARN:-0}
escape_awk='@ESCAPE@'
dcgmi_awk='@DCGMI@'
nccl_awk='@NCCL@'
say() {
  printf '%s\n%s\n%s\n' "$1" "$2" "$3" | LC_ALL=C awk "$escape_awk" > "$result_file"
  printf 'validation %s: %s: %s\n' "$1" "$2" "$3"
}
work=$(mktemp -d 2>/dev/null) || { work=/tmp/gpuheal-validate.$$; mkdir -p "$work"; }
trap 'rm -rf "$work"' EXIT
# 1. The GPUs the container sees: a device node /dev/nvidia<N> for each.
seen=0
for node in "$devices"/nvidia[0-9]*; do
  case ${node##*/} in nvidia*[!0-9]*) continue ;; esac
  [ -e "$node" ] && seen=$((seen + 1))
done
if [ "$seen" -lt "$want" ]; then
  say fail gpu-count "saw $seen of $want GPUs (/dev/nvidia[0-9]* in the container)"; exit 1
fi
# 2. DCGM's diagnostic, judged by its JSON and its exit code together.
if ! command -v dcgmi >/dev/null 2>&1; then
  say fail dcgmi-diag "dcgmi is not in the image"; exit 1
fi
if command -v nv-hostengine >/dev/null 2>&1; then nv-hostengine >/dev/null 2>&1; fi
dcgmi diag -r "$level" -j > "$work/dcgmi.out" 2> "$work/dcgmi.err"; rc=$?
verdict=$(LC_ALL=C awk -v level="$level" -v want="$want" -v rc="$rc" -v failwarn="$failwarn" \
  "$dcgmi_awk" "$work/dcgmi.out" "$work/dcgmi.err" 2>&1)
case $verdict in
  "pass "*) dcgm=${verdict#pass } ;;
  "fail "*) say fail dcgmi-diag "${verdict#fail }"; exit 1 ;;
  *) say fail dcgmi-diag "dcgmi diag -r $level exited $rc; its output could not be read: $verdict"
     exit 1 ;;
esac
# 3. On a multi-GPU node with a threshold: NCCL's all-reduce across all of them.
if [ "$want" -gt 1 ] && [ "$min" != "0" ]; then
  if ! command -v all_reduce_perf >/dev/null 2>&1; then
    say fail nccl-all-reduce "all_reduce_perf is not in the image"; exit 1
  fi
  all_reduce_perf -b 1G -e 1G -g "$want" > "$work/nccl.out" 2> "$work/nccl.err"; rc=$?
  verdict=$(LC_ALL=C awk -v gpus="$want" -v min="$min" -v rc="$rc" \
    "$nccl_awk" "$work/nccl.out" "$work/nccl.err" 2>&1)
  case $verdict in
    "pass "*) say pass dcgmi-diag+nccl-all-reduce "$dcgm; ${verdict#pass }"; exit 0 ;;
    "fail "*) say fail nccl-all-reduce "${verdict#fail }"; exit 1 ;;
    *) say fail nccl-all-reduce "all_reduce_perf exited $rc; its output could not be read: $verdict"
       exit 1 ;;
  esac
fi
say pass dcgmi-diag "$dcgm"
"""
for _name, _awk in (("ESCAPE", ESCAPE_AWK), ("DCGMI", DCGMI_AWK), ("NCCL", NCCL_AWK)):
    # Each program sits in single quotes in the script: it must hold none.
    if "'" in _awk:
        raise ValueError(f"the {_name} awk program holds a single quote")
    SCRIPT = SCRIPT.replace(f"@{_name}@", _awk)
