"""Grammar compilation for the scheduler: a cache keyed by (kind, text) and one worker thread,
so compiling never runs on the scheduler's step loop. A request waits (not admitted) until
its grammar is ready; the HF tokenizer and xgrammar load on the first constrained request."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from server.errors import InvalidRequestError
from server.grammar.matcher import RequestGrammar
from server.grammar.spec import GrammarKind, GrammarSpec, clean_error

MAX_CACHED_GRAMMARS = 256


class GrammarCompiler:
    def __init__(self, load_tokenizer: Callable[[], Any], vocab_size: int, stop_token_ids: list[int],
                 max_cached: int = MAX_CACHED_GRAMMARS) -> None:
        self._load_tokenizer = load_tokenizer  # the HF tokenizer, loaded on first use
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self.max_cached = max_cached
        self.num_compiled = 0  # cache misses, for tests and metrics
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._xgr_compiler: Any = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenledger-grammar")

    def submit(self, spec: GrammarSpec) -> Future[Any]:
        """A future of the compiled grammar; already done on a cache hit."""
        with self._lock:
            cached = self._cache.get(spec.key)
            if cached is not None:
                self._cache.move_to_end(spec.key)
        if cached is None:
            return self._executor.submit(self.compile, spec)
        done: Future[Any] = Future()
        done.set_result(cached)
        return done

    def compile(self, spec: GrammarSpec) -> Any:
        """Compiles (or returns the cached) grammar; InvalidRequestError naming the field if bad."""
        with self._lock:
            if spec.key in self._cache:
                self._cache.move_to_end(spec.key)
                return self._cache[spec.key]
        compiler = self._compiler()
        try:
            if spec.kind is GrammarKind.JSON_SCHEMA:
                # Compact JSON: with free whitespace a weak model can loop on blanks until its length limit.
                compiled = compiler.compile_json_schema(spec.source, any_whitespace=False)
            elif spec.kind is GrammarKind.REGEX:
                compiled = compiler.compile_regex(spec.source)
            else:
                compiled = compiler.compile_grammar(spec.source)
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError on a bad constraint
            raise InvalidRequestError(f"invalid {spec.kind.value}: {clean_error(exc)}", spec.kind.value) from None
        with self._lock:
            self.num_compiled += 1
            self._cache[spec.key] = compiled
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: Any) -> RequestGrammar:
        import xgrammar as xgr

        return RequestGrammar(xgr.GrammarMatcher(compiled))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _compiler(self) -> Any:
        if self._xgr_compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(self._load_tokenizer(), vocab_size=self.vocab_size,
                                                      stop_token_ids=self.stop_token_ids)
            self._xgr_compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._xgr_compiler
