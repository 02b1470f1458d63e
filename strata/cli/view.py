"""`strata view -c CODE | MODEL`: the whole compilation as one offline HTML page (strata/view).

Why a command of its own: `strata compile` prints one stage; the page holds them all, linked
(an op to its kernels and lines), with each kernel's passes, diffs and knobs. The page's path
goes to stdout (logs to stderr, as for every command), so `xdg-open $(strata view -c ...)` works;
`--serve` also serves it on localhost until interrupted."""
from __future__ import annotations

import http.server
from pathlib import Path
import sys
import time

from ..core.errors import StrataError

DEFAULT_OUTPUT = "strata-view.html"


def add_parser(sub, common, model_options) -> None:
    v = sub.add_parser("view", help="write the whole compilation as one offline HTML page "
                                    "(stages side by side, passes, diffs, knobs)")
    v.add_argument("model", nargs="?", help="a bundled model name, a directory with config.json "
                                            "or a llama GGUF file (as for strata compile)")
    common(v)
    model_options(v)
    v.add_argument("--device", choices=("sim", "cpu", "cuda"),
                   help="also run a -c snippet there and show its verdict against float64 "
                        "eager (cpu: native C for this machine; default: compile only)")
    v.add_argument("--bench", action="store_true",
                   help="with --device cpu: also time the snippet against eager and "
                        "torch.compile, and each kernel alone (tens of seconds)")
    v.add_argument("-o", "--output", default=DEFAULT_OUTPUT,
                   help=f"the page to write (default {DEFAULT_OUTPUT})")
    v.add_argument("--serve", action="store_true",
                   help="then serve the page on localhost (http.server) until Ctrl-C")
    v.add_argument("--port", type=int, default=0,
                   help="with --serve: the port (default: a free one)")


def view_command(args, ctx) -> int:
    from ..api import check_device, compile_model, compile_snippet
    from ..view import write_page
    from ..view.record import recording
    if args.model and args.code:
        raise StrataError("give either MODEL or -c CODE, not both")
    if not args.model and (args.layer is not None or args.dtype or args.quant):
        raise StrataError("--layer, --dtype and --quant apply to a MODEL; -c snippets take their "
                          "own dtypes")
    if not args.model and not args.code:
        raise StrataError("nothing to view: give MODEL or -c CODE")
    if args.bench and args.device != "cpu":
        raise StrataError("--bench times native kernels here: add --device cpu")
    if args.bench and args.model:
        raise StrataError("--bench times a -c snippet; a MODEL's page has no timings yet")
    if args.device:
        check_device(args.device)
    if not Path(args.output).resolve().parent.is_dir():
        raise StrataError(f"cannot write {args.output}: its directory does not exist")
    rec = recording(ctx)
    t0 = time.perf_counter()
    verdict, profiles, bench = None, {}, None
    if args.model:
        program, built = compile_model(args.model, layer=args.layer, seq_len=args.seq_len,
                                       dtype=args.dtype, ctx=rec, device=args.device,
                                       quant=args.quant)
        title = f"{built.what}, seq {args.seq_len}"
    else:
        program, snippet = compile_snippet(args.code, rec, device=args.device)
        title = ""
        if args.device:
            from ..bench.check import compare_with_eager
            from ..kernel_ir.sim_profile import profiling
            with profiling() as profiles:            # the simulator's counters, when it runs
                verdict = compare_with_eager(program, snippet)
        if args.bench and verdict.passed:
            from ..bench.cpu_bench import view_bench
            bench = view_bench(program, snippet)
    size = write_page(program, args.output, verdict=verdict, title=title, profiles=profiles,
                      bench=bench)
    print(f"strata: {len(program.kernels)} kernels, {size / 1e6:.2f} MB page in "
          f"{time.perf_counter() - t0:.1f} s" +
          (f"; verdict {'PASS' if verdict.passed else 'FAIL'}" if verdict else ""), file=sys.stderr)
    print(args.output)
    sys.stdout.flush()
    if args.serve:
        serve(args.output, args.port)
    return 0


def serve(path: str, port: int) -> None:
    """Serve the one page on 127.0.0.1 (every path answers with it) until interrupted."""
    body = Path(path).read_bytes()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *a):          # requests are not worth a line on stderr
            pass

    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Page)
    except OSError as e:
        raise StrataError(f"cannot serve on port {port}: {e.strerror}") from None
    print(f"http://127.0.0.1:{server.server_address[1]}/", flush=True)
    print("strata: serving the page; Ctrl-C stops", file=sys.stderr)
    with server:
        server.serve_forever()
