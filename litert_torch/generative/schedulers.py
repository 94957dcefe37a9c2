"""Diffusion schedulers in NumPy, built from diffusers scheduler configs.

    scheduler = numpy_scheduler(pipe.scheduler)          # or its config dict with "_class_name"
    scheduler.set_timesteps(20)
    latents = latents * scheduler.init_noise_sigma
    for i, t in enumerate(scheduler.timesteps):
        noise = denoise(scheduler.scale_model_input(latents, i), t, ...)
        latents = scheduler.step(noise, i, latents)

What runs next to a LiteRT model on a device: no torch, no diffusers. Each scheduler
reads the fields diffusers' own reads (betas, timestep spacing, prediction type...) and
follows diffusers' arithmetic in float32, so that the same model outputs give the same
latents (tests/litert_torch/generative/test_diffusion.py compares every step). A config
field whose math is not implemented here is refused by name (`UnsupportedSchedulerError`),
never ignored. Steps are indexed by position in `timesteps` (diffusers finds the same
index from the timestep's value).

Implemented: `DDIMScheduler` (eta = 0, StableDiffusionPipeline's default),
`EulerDiscreteScheduler` (s_churn = 0, the pipeline's default) and `PNDMScheduler` (SD 1.x's
own scheduler: PRK warm-up or `skip_prk_steps`, then PLMS).
"""

from __future__ import annotations

import math

import numpy as np


class UnsupportedSchedulerError(NotImplementedError):
    """The scheduler (or a field of its config) has no NumPy implementation here."""


def _linspace32(start: float, end: float, n: int) -> np.ndarray:
    """torch.linspace in float32, bit for bit: a float32 step, the first half counted up
    from `start` and the second down from `end`, each a fused multiply-add (np.linspace
    differs in the last bit for about a fifth of the values)."""
    f = np.float32
    step = np.float64(f((f(end) - f(start)) / f(max(n - 1, 1))))
    i = np.arange(n, dtype=np.float64)
    up = np.float64(f(start)) + step * i
    down = np.float64(f(end)) - step * (n - 1 - i)
    return np.where(i < n // 2, up, down).astype(np.float32)


def _cumprod(values: np.ndarray) -> np.ndarray:
    """float32 cumulative product accumulated in float64, as torch.cumprod does (a float32
    accumulator drifts by ~3e-7 over 1000 steps, which moves small sigmas by ~1e-4)."""
    return np.cumprod(values.astype(np.float64)).astype(np.float32)


def _betas(config: dict, name: str) -> np.ndarray:
    """diffusers' beta schedule (float32), then its zero-terminal-SNR rescale if asked."""
    n = int(config["num_train_timesteps"])
    trained = config.get("trained_betas")
    schedule = config.get("beta_schedule", "linear")
    start, end = float(config.get("beta_start", 1e-4)), float(config.get("beta_end", 0.02))
    if trained is not None:
        betas = np.asarray(trained, dtype=np.float32)
    elif schedule == "linear":
        betas = _linspace32(start, end, n)
    elif schedule == "scaled_linear":  # latent diffusion's: linear in sqrt(beta)
        betas = _linspace32(start**0.5, end**0.5, n) ** 2
    elif schedule == "squaredcos_cap_v2":  # cosine alpha-bar (Nichol & Dhariwal), each beta capped at 0.999

        def alpha_bar(t):
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

        betas = np.array(
            [min(1 - alpha_bar((i + 1) / n) / alpha_bar(i / n), 0.999) for i in range(n)], dtype=np.float32
        )
    else:
        raise UnsupportedSchedulerError(
            f"{name}: config.beta_schedule={schedule!r} is not implemented "
            "(supported: 'linear', 'scaled_linear', 'squaredcos_cap_v2', or trained_betas)"
        )
    if config.get("rescale_betas_zero_snr", False):
        betas = _rescale_zero_terminal_snr(betas)
    return betas


def _rescale_zero_terminal_snr(betas: np.ndarray) -> np.ndarray:
    """Shift and scale sqrt(alpha_bar) so that the last step has zero signal (Lin et al. 2023, algorithm 1)."""
    root = np.sqrt(_cumprod(1 - betas))
    first, last = root[0].copy(), root[-1].copy()
    root = (root - last) * (first / (first - last))
    alpha_bar = root**2
    alphas = np.concatenate([alpha_bar[:1], alpha_bar[1:] / alpha_bar[:-1]])
    return (1 - alphas).astype(np.float32)


def _spaced_timesteps(config: dict, steps: int, name: str) -> np.ndarray:
    """diffusers' `timestep_spacing` ("linspace", "leading", "trailing"), descending, float64."""
    n = int(config["num_train_timesteps"])
    spacing = config.get("timestep_spacing", "leading")
    if spacing == "linspace":
        return np.linspace(0, n - 1, steps)[::-1].copy()
    if spacing == "leading":
        return (np.arange(0, steps) * (n // steps)).round()[::-1].copy() + int(config.get("steps_offset", 0))
    if spacing == "trailing":
        return np.round(np.arange(n, 0, -n / steps)) - 1
    raise UnsupportedSchedulerError(
        f"{name}: config.timestep_spacing={spacing!r} is not implemented (supported: 'linspace', 'leading', 'trailing')"
    )


def _refuse(config: dict, name: str, fields: dict) -> None:
    """Refuse each `field: (value it must have, what it would do)` the config sets otherwise."""
    for field, (default, what) in fields.items():
        value = config.get(field, default)
        if value != default:
            raise UnsupportedSchedulerError(f"{name}: config.{field}={value!r} ({what}) is not implemented")


class NumpyScheduler:
    """The interface the LiteRT pipeline drives: `set_timesteps(n)`, `timesteps`,
    `init_noise_sigma`, `scale_model_input(sample, i)`, `step(model_output, i, sample)`."""

    name = "scheduler"
    # diffusers' defaults for fields a saved config may leave out (they differ per scheduler)
    DEFAULTS = {"num_train_timesteps": 1000, "beta_schedule": "linear", "prediction_type": "epsilon"}

    def __init__(self, config: dict):
        self.config = {**NumpyScheduler.DEFAULTS, **self.DEFAULTS, **config}
        self.betas = _betas(self.config, self.name)
        self.alphas_cumprod = _cumprod(1 - self.betas)
        self.num_train_timesteps = int(self.config["num_train_timesteps"])
        self.prediction_type = self.config.get("prediction_type", "epsilon")
        self.timesteps = np.zeros(0, np.float32)

    def _check_steps(self, steps) -> int:
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)):
            raise TypeError(f"num_inference_steps must be an int, got {steps!r}")
        if not 1 <= steps <= self.num_train_timesteps:
            raise ValueError(
                f"num_inference_steps must be between 1 and the scheduler's num_train_timesteps "
                f"({self.num_train_timesteps}), got {steps}"
            )
        return int(steps)

    def scale_model_input(self, sample: np.ndarray, i: int) -> np.ndarray:
        return sample

    @property
    def init_noise_sigma(self) -> float:
        return 1.0


class DDIMScheduler(NumpyScheduler):
    """diffusers' `DDIMScheduler.step` with eta = 0: predicted x0 (from epsilon, v or the
    sample; clipped when `clip_sample`), then the deterministic DDIM update."""

    name = "DDIMScheduler"
    DEFAULTS = {"timestep_spacing": "leading", "clip_sample": True, "set_alpha_to_one": True}

    def __init__(self, config: dict):
        _refuse(config, self.name, {"thresholding": (False, "dynamic thresholding of the predicted sample")})
        super().__init__(config)
        if self.prediction_type not in ("epsilon", "sample", "v_prediction"):
            raise UnsupportedSchedulerError(f"{self.name}: config.prediction_type={self.prediction_type!r}")
        one = self.config.get("set_alpha_to_one", True)
        self.final_alpha_cumprod = np.float32(1.0) if one else self.alphas_cumprod[0]

    def set_timesteps(self, num_inference_steps: int) -> None:
        self.num_inference_steps = self._check_steps(num_inference_steps)
        # DDIM's timesteps are integers (it indexes alphas_cumprod by them)
        self.timesteps = _spaced_timesteps(self.config, self.num_inference_steps, self.name).round().astype(np.int64)

    def step(self, model_output: np.ndarray, i: int, sample: np.ndarray) -> np.ndarray:
        t = int(self.timesteps[i])
        prev = t - self.num_train_timesteps // self.num_inference_steps
        alpha = self.alphas_cumprod[t]
        alpha_prev = self.alphas_cumprod[prev] if prev >= 0 else self.final_alpha_cumprod
        beta = np.float32(1) - alpha
        if self.prediction_type == "epsilon":
            x0 = (sample - beta**0.5 * model_output) / alpha**0.5
            eps = model_output
        elif self.prediction_type == "sample":
            x0 = model_output
            eps = (sample - alpha**0.5 * x0) / beta**0.5
        else:  # v_prediction
            x0 = alpha**0.5 * sample - beta**0.5 * model_output
            eps = alpha**0.5 * model_output + beta**0.5 * sample
        if self.config.get("clip_sample", True):
            limit = np.float32(self.config.get("clip_sample_range", 1.0))
            x0 = np.clip(x0, -limit, limit)
        return (alpha_prev**0.5 * x0 + (np.float32(1) - alpha_prev) ** 0.5 * eps).astype(np.float32)


class EulerDiscreteScheduler(NumpyScheduler):
    """diffusers' `EulerDiscreteScheduler` with s_churn = 0: sigmas interpolated at the
    spaced timesteps (or Karras / exponential spacing), inputs scaled by
    1/sqrt(sigma^2 + 1), one Euler step of the probability-flow ODE."""

    name = "EulerDiscreteScheduler"
    DEFAULTS = {"timestep_spacing": "linspace"}

    def __init__(self, config: dict):
        _refuse(
            config,
            self.name,
            {
                "use_beta_sigmas": (False, "beta-distributed sigmas"),
                "interpolation_type": ("linear", "sigma interpolation other than linear"),
                "timestep_type": ("discrete", "continuous timesteps"),
            },
        )
        super().__init__(config)
        if self.prediction_type not in ("epsilon", "sample", "original_sample", "v_prediction"):
            raise UnsupportedSchedulerError(f"{self.name}: config.prediction_type={self.prediction_type!r}")
        if self.config.get("rescale_betas_zero_snr", False):
            self.alphas_cumprod[-1] = 2.0**-24  # diffusers' guard: the first sigma stays finite
        self.train_sigmas = ((1 - self.alphas_cumprod) / self.alphas_cumprod) ** 0.5
        self.sigmas = np.concatenate([self.train_sigmas[::-1], [0]]).astype(np.float32)

    @property
    def init_noise_sigma(self) -> float:
        top = float(self.sigmas.max())
        if self.config.get("timestep_spacing", "linspace") in ("linspace", "trailing"):
            return top
        return (top**2 + 1) ** 0.5

    def set_timesteps(self, num_inference_steps: int) -> None:
        steps = self.num_inference_steps = self._check_steps(num_inference_steps)
        timesteps = _spaced_timesteps(self.config, steps, self.name).astype(np.float32)
        sigmas = np.interp(timesteps, np.arange(len(self.train_sigmas)), self.train_sigmas)
        karras, exponential = self.config.get("use_karras_sigmas"), self.config.get("use_exponential_sigmas")
        if karras or exponential:
            low = self.config.get("sigma_min") or float(sigmas[-1])
            high = self.config.get("sigma_max") or float(sigmas[0])
            if karras:  # Karras et al. 2022, rho = 7
                ramp = np.linspace(0, 1, steps)
                sigmas = (high ** (1 / 7) + ramp * (low ** (1 / 7) - high ** (1 / 7))) ** 7
            else:
                sigmas = np.exp(np.linspace(math.log(high), math.log(low), steps))
            timesteps = self._sigma_to_t(sigmas)
        final = self.config.get("final_sigmas_type", "zero")
        if final == "zero":
            last = 0.0
        elif final == "sigma_min":
            last = float(self.train_sigmas[0])
        else:
            raise UnsupportedSchedulerError(f"{self.name}: config.final_sigmas_type={final!r}")
        self.sigmas = np.concatenate([sigmas, [last]]).astype(np.float32)
        self.timesteps = np.asarray(timesteps, dtype=np.float32)

    def _sigma_to_t(self, sigmas: np.ndarray) -> np.ndarray:
        """The (fractional) training timestep of each sigma: linear interpolation in log sigma."""
        log_train = np.log(self.train_sigmas)
        log_sigma = np.log(np.maximum(sigmas, 1e-10))
        dists = log_sigma - log_train[:, None]
        low = np.cumsum(dists >= 0, axis=0).argmax(axis=0).clip(max=len(log_train) - 2)
        w = np.clip((log_train[low] - log_sigma) / (log_train[low] - log_train[low + 1]), 0, 1)
        return (1 - w) * low + w * (low + 1)

    def scale_model_input(self, sample: np.ndarray, i: int) -> np.ndarray:
        return (sample / (self.sigmas[i] ** 2 + 1) ** 0.5).astype(np.float32)

    def step(self, model_output: np.ndarray, i: int, sample: np.ndarray) -> np.ndarray:
        sigma = self.sigmas[i]
        if self.prediction_type == "epsilon":
            x0 = sample - sigma * model_output
        elif self.prediction_type == "v_prediction":
            x0 = model_output * (-sigma / (sigma**2 + 1) ** 0.5) + sample / (sigma**2 + 1)
        else:
            x0 = model_output
        derivative = (sample - x0) / sigma
        return (sample + derivative * (self.sigmas[i + 1] - sigma)).astype(np.float32)


class PNDMScheduler(NumpyScheduler):
    """diffusers' `PNDMScheduler` (Stable Diffusion 1.x's default): pseudo Runge-Kutta
    warm-up steps (unless `skip_prk_steps`), then linear multistep (PLMS) over the last
    four noise predictions. It keeps state between steps: `set_timesteps` resets it, and
    steps must come in order."""

    name = "PNDMScheduler"
    DEFAULTS = {"timestep_spacing": "leading", "set_alpha_to_one": False}

    def __init__(self, config: dict):
        super().__init__(config)
        if self.prediction_type not in ("epsilon", "v_prediction"):
            raise UnsupportedSchedulerError(f"{self.name}: config.prediction_type={self.prediction_type!r}")
        one = self.config.get("set_alpha_to_one", False)
        self.final_alpha_cumprod = np.float32(1.0) if one else self.alphas_cumprod[0]
        self.skip_prk = bool(self.config.get("skip_prk_steps", False))

    def set_timesteps(self, num_inference_steps: int) -> None:
        steps = self.num_inference_steps = self._check_steps(num_inference_steps)
        ascending = _spaced_timesteps(self.config, steps, self.name)[::-1].round().astype(np.int64)
        ratio = self.num_train_timesteps // steps
        if self.skip_prk:
            # PLMS only; its first step is taken twice (a two-point start at the same timestep)
            self.prk_timesteps = np.zeros(0, np.int64)
            plms = np.concatenate([ascending[:-1], ascending[-2:-1], ascending[-1:]])[::-1]
        else:
            if steps < 4:
                raise ValueError(
                    f"{self.name}: num_inference_steps must be at least 4 for its Runge-Kutta warm-up, got {steps} "
                    "(or set skip_prk_steps=True in the scheduler config)"
                )
            # each of the last four timesteps and its half step, as RK's four evaluations
            pairs = ascending[-4:].repeat(2) + np.tile([0, ratio // 2], 4)
            self.prk_timesteps = pairs[:-1].repeat(2)[1:-1][::-1].copy()
            plms = ascending[:-3][::-1]
        self.timesteps = np.concatenate([self.prk_timesteps, plms]).astype(np.int64)
        self._history: list[np.ndarray] = []  # the latest noise predictions, oldest first
        self._count = 0
        self._rk_sum = 0.0
        self._start_sample = None

    def step(self, model_output: np.ndarray, i: int, sample: np.ndarray) -> np.ndarray:
        t = int(self.timesteps[i])
        if self._count < len(self.prk_timesteps) and not self.skip_prk:
            out = self._runge_kutta(model_output, t, sample)
        else:
            out = self._multistep(model_output, t, sample)
        self._count += 1
        return out.astype(np.float32)

    def _runge_kutta(self, model_output, t, sample):
        phase = self._count % 4
        prev_t = t - (0 if self._count % 2 else self.num_train_timesteps // self.num_inference_steps // 2)
        t = int(self.prk_timesteps[self._count // 4 * 4])
        if phase == 0:
            self._rk_sum = self._rk_sum + model_output / 6
            self._history.append(model_output)
            self._start_sample = sample
        elif phase in (1, 2):
            self._rk_sum = self._rk_sum + model_output / 3
        else:
            model_output, self._rk_sum = self._rk_sum + model_output / 6, 0.0
        start = self._start_sample if self._start_sample is not None else sample
        return self._transfer(start, t, prev_t, model_output)

    def _multistep(self, model_output, t, sample):
        ratio = self.num_train_timesteps // self.num_inference_steps
        prev_t = t - ratio
        if self._count == 1:  # the repeated first step: from the start sample, over the same interval
            prev_t, t = t, t + ratio
        else:
            self._history = self._history[-3:] + [model_output]
        e = self._history
        if len(e) == 1 and self._count == 0:
            self._start_sample = sample
        elif len(e) == 1 and self._count == 1:
            model_output = (model_output + e[-1]) / 2
            sample, self._start_sample = self._start_sample, None
        elif len(e) == 2:
            model_output = (3 * e[-1] - e[-2]) / 2
        elif len(e) == 3:
            model_output = (23 * e[-1] - 16 * e[-2] + 5 * e[-3]) / 12
        else:
            model_output = (1 / 24) * (55 * e[-1] - 59 * e[-2] + 37 * e[-3] - 9 * e[-4])
        return self._transfer(sample, t, prev_t, model_output)

    def _transfer(self, sample, t, prev_t, model_output):
        """x_{prev_t} from x_t and a noise estimate (PNDM's transfer function, eq. 9)."""
        alpha = self.alphas_cumprod[t]
        alpha_prev = self.alphas_cumprod[prev_t] if prev_t >= 0 else self.final_alpha_cumprod
        beta, beta_prev = np.float32(1) - alpha, np.float32(1) - alpha_prev
        if self.prediction_type == "v_prediction":
            model_output = alpha**0.5 * model_output + beta**0.5 * sample
        denominator = alpha * beta_prev**0.5 + (alpha * beta * alpha_prev) ** 0.5
        return (alpha_prev / alpha) ** 0.5 * sample - (alpha_prev - alpha) * model_output / denominator


SCHEDULERS = {cls.name: cls for cls in (DDIMScheduler, EulerDiscreteScheduler, PNDMScheduler)}


def numpy_scheduler(scheduler) -> NumpyScheduler:
    """A NumPy scheduler from a diffusers scheduler object, or from a config dict naming
    its class under "_class_name" (what `scheduler.save_config` writes)."""
    if isinstance(scheduler, NumpyScheduler):
        return scheduler
    if isinstance(scheduler, dict):
        config, name = dict(scheduler), scheduler.get("_class_name")
        if name is None:
            raise ValueError(
                "scheduler: a config dict must name its class under '_class_name' "
                f"(one of {sorted(SCHEDULERS)}), or pass the diffusers scheduler itself"
            )
    elif hasattr(scheduler, "config"):
        config, name = dict(scheduler.config), type(scheduler).__name__
    else:
        raise TypeError(
            f"scheduler must be a diffusers scheduler, its config dict or a NumpyScheduler, got {type(scheduler).__name__}"
        )
    if name not in SCHEDULERS:
        raise UnsupportedSchedulerError(
            f"scheduler {name!r} has no NumPy implementation (implemented: {sorted(SCHEDULERS)}); "
            "switch the diffusers pipeline to one, e.g. "
            "pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)"
        )
    return SCHEDULERS[name](config)
