"""kwok stages that play a validation Job's container (healthGate.validation).

kwok runs no container; these stages end a pod the way its container would have,
chosen by the pod's environment, which the controller's config sets
(healthGate.validation.env):

- GPUHEAL_SIM_EXIT_CODE (and GPUHEAL_SIM_MESSAGE): the container exits with that
  code, its termination message that text (phase Succeeded for 0, else Failed);
- GPUHEAL_SIM_HANG: it runs for a day (a validation that never finishes).

They outweigh kwok's own pod-complete stage (weight 0), which would end any Job's
pod at once with exit 0 and no message. Other pods never match them.
"""

from __future__ import annotations

from pathlib import Path

EXIT_CODE_ENV = "GPUHEAL_SIM_EXIT_CODE"
MESSAGE_ENV = "GPUHEAL_SIM_MESSAGE"
HANG_ENV = "GPUHEAL_SIM_HANG"

_SELECT = """\
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.spec.containers.[].env.[] | select( .name == "{env}" ) | .name'
      operator: 'Exists'"""

_END = """\
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $code := "{code}" }}}}
      {{{{ $message := "" }}}}
      {{{{ range (index .spec.containers 0).env }}}}
      {{{{ if eq .name "{exit_env}" }}}}{{{{ $code = .value }}}}{{{{ end }}}}
      {{{{ if eq .name "{message_env}" }}}}{{{{ $message = .value }}}}{{{{ end }}}}
      {{{{ end }}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {{{{ $code }}}}
            message: {{{{ $message | Quote }}}}
            reason: {{{{ if eq $code "0" }}}}Completed{{{{ else }}}}Error{{{{ end }}}}
            startedAt: {{{{ $now | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: {{{{ if eq $code "0" }}}}Succeeded{{{{ else }}}}Failed{{{{ end }}}}"""


def _stage(name: str, env: str, *, delay_ms: int = 0) -> str:
    delay = f"  delay:\n    durationMilliseconds: {delay_ms}\n" if delay_ms else ""
    end = _END.format(code="0", exit_env=EXIT_CODE_ENV, message_env=MESSAGE_ENV)
    return (
        "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\n"
        f"metadata:\n  name: {name}\nspec:\n"
        "  resourceRef:\n    apiGroup: v1\n    kind: Pod\n"
        f"  selector:\n{_SELECT.format(env=env)}\n"
        "  weight: 1\n"
        f"{delay}"
        f"  next:\n{end}\n"
    )


STAGES = "---\n".join(
    (
        _stage("gpuheal-validation-end", EXIT_CODE_ENV),
        _stage("gpuheal-validation-hang", HANG_ENV, delay_ms=86_400_000),
    )
)


def write_stages(directory: Path) -> Path:
    path = directory / "kwok-validation-stages.yaml"
    path.write_text(STAGES)
    return path
