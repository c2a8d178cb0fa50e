#!/usr/bin/env bash
# Validates every Kubernetes manifest offline against the Kubernetes JSON
# schemas bundled in the PyPI package `kubernetes-validate` (strict: an
# unknown field is an error). Kustomizations are not Kubernetes resources;
# `tests/deploy.rs` checks what they name, and every port, path, flag and
# environment variable against the binary.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v kubernetes-validate >/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0
fi
files=()
while IFS= read -r f; do
  case "$(basename "$f")" in kustomization.yaml) continue ;; esac
  files+=("$f")
done < <(find . -name '*.yaml' | sort)
kubernetes-validate --kubernetes-version 1.33.0 --strict --quiet "${files[@]}"
echo "kubernetes manifests: ${#files[@]} files valid"
