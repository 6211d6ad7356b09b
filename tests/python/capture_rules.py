"""Optimizers written as PyTorch functions, as papers and torch.optim state them, each twice:
in place (torch.optim's style) and functional (returning the new values). test_capture.py
captures them; the functions run eagerly too, as the reference.

Scalars arrive as 0-dim tensors (eagerly as well), hence ``bc2.sqrt()`` rather than
``math.sqrt(bc2)``.
"""

import torch


# ---- Adam / AdamW (Kingma & Ba 2015; Loshchilov & Hutter 2019), torch.optim's maximize -------
def adamw_inplace(p, grad, exp_avg, exp_avg_sq, *, lr, betas, eps, weight_decay, maximize, step):
    beta1, beta2 = betas
    grad = torch.where(maximize, -grad, grad)
    p.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    denom = (exp_avg_sq.sqrt() / bias_correction2.sqrt()).add_(eps)
    p.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)


def adamw_functional(p, grad, exp_avg, exp_avg_sq, *, lr, betas, eps, weight_decay, maximize, step):
    b1, b2 = betas
    g = torch.where(maximize, -grad, grad)
    m = torch.lerp(exp_avg, g, 1 - b1)
    v = b2 * exp_avg_sq + (1 - b2) * (g * g)
    m_hat_scale = lr / (1 - b1**step)
    denom = torch.sqrt(v) / torch.sqrt(1 - b2**step) + eps
    return p * (1 - lr * weight_decay) - m_hat_scale * (m / denom), m, v


def adam_inplace(p, grad, exp_avg, exp_avg_sq, *, lr, betas, eps, weight_decay, maximize, step):
    beta1, beta2 = betas
    grad = torch.where(maximize, -grad, grad)
    grad = grad.add(p, alpha=weight_decay)  # L2 penalty, in the gradient
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denom = (exp_avg_sq.sqrt() / (1 - beta2**step).sqrt()).add_(eps)
    p.addcdiv_(exp_avg, denom, value=-step_size)


def adam_functional(p, grad, exp_avg, exp_avg_sq, *, lr, betas, eps, weight_decay, maximize, step):
    b1, b2 = betas
    g = torch.where(maximize, -grad, grad) + weight_decay * p
    m = exp_avg + (1 - b1) * (g - exp_avg)
    v = exp_avg_sq * b2 + g.square() * (1 - b2)
    denom = v.sqrt() * (1 - b2**step).rsqrt() + eps
    return {"p": p - lr / (1 - b1**step) * (m / denom), "exp_avg": m, "exp_avg_sq": v}


# ---- SGD with Nesterov momentum (Sutskever et al. 2013), torch.optim.SGD's form ---------------
# torch starts the buffer as the first gradient; buf_decay / grad_coef (host_scalars below) make
# that step buf = 0 * buf + 1 * g, as the library does.
def sgd_host_scalars(group, step):
    first = step == 1
    return {
        "buf_decay": 0.0 if first else group["momentum"],
        "grad_coef": 1.0 if first else 1.0 - group["dampening"],
    }


def sgd_nesterov_inplace(
    p, grad, momentum_buffer, *, lr, momentum, weight_decay, maximize, buf_decay, grad_coef
):
    d_p = torch.where(maximize, -grad, grad).add(p, alpha=weight_decay)
    momentum_buffer.mul_(buf_decay).add_(d_p, alpha=grad_coef)
    d_p = d_p.add(momentum_buffer, alpha=momentum)
    p.add_(d_p, alpha=-lr)


def sgd_nesterov_functional(
    p, grad, momentum_buffer, *, lr, momentum, weight_decay, maximize, buf_decay, grad_coef
):
    d_p = torch.where(maximize, -grad, grad) + weight_decay * p
    buf = momentum_buffer * buf_decay + grad_coef * d_p
    return p - lr * (d_p + momentum * buf), buf


# ---- Lion (Chen et al. 2023), as lion-pytorch ---------------------------------------------------
def lion_inplace(p, grad, exp_avg, *, lr, betas, weight_decay):
    beta1, beta2 = betas
    p.mul_(1 - lr * weight_decay)
    update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()
    p.add_(update, alpha=-lr)
    exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)


def lion_functional(p, grad, exp_avg, *, lr, betas, weight_decay):
    beta1, beta2 = betas
    c = beta1 * exp_avg + (1 - beta1) * grad
    return (p * (1 - lr * weight_decay) - lr * torch.sign(c), beta2 * exp_avg + (1 - beta2) * grad)


# ---- Adan (Xie et al. 2022, Algorithm 1 as the authors' PyTorch code, with no_prox) -----------
# prev_grad starts at zero; the first step's gradient difference is zero (the authors start
# pre_grad at the first gradient), hence the where on the step.
def adan_inplace(
    p, grad, exp_avg, exp_avg_diff, exp_avg_sq, prev_grad, *, lr, betas, eps, weight_decay, step
):
    beta1, beta2, beta3 = betas
    diff = torch.where(step > 1, grad - prev_grad, 0.0)
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_diff.mul_(beta2).add_(diff, alpha=1 - beta2)
    update = grad + beta2 * diff
    exp_avg_sq.mul_(beta3).addcmul_(update, update, value=1 - beta3)
    denom = (exp_avg_sq.sqrt() / (1 - beta3**step).sqrt()).add_(eps)
    update = (
        (exp_avg / (1 - beta1**step))
        .add_(exp_avg_diff, alpha=beta2 / (1 - beta2**step))
        .div_(denom)
    )
    p.mul_(1 - lr * weight_decay).add_(update, alpha=-lr)
    prev_grad.copy_(grad)


def adan_functional(
    p, grad, exp_avg, exp_avg_diff, exp_avg_sq, prev_grad, *, lr, betas, eps, weight_decay, step
):
    b1, b2, b3 = betas
    diff = torch.where(step > 1, grad - prev_grad, 0.0)
    m = b1 * exp_avg + (1 - b1) * grad
    d = b2 * exp_avg_diff + (1 - b2) * diff
    u = grad + b2 * diff
    n = b3 * exp_avg_sq + (1 - b3) * (u * u)
    denom = n.sqrt() / (1 - b3**step).sqrt() + eps
    update = (m / (1 - b1**step) + b2 / (1 - b2**step) * d) / denom
    return {
        "p": p * (1 - lr * weight_decay) - lr * update,
        "exp_avg": m,
        "exp_avg_diff": d,
        "exp_avg_sq": n,
        "prev_grad": grad,
    }


# ---- A row reduction: SGD with momentum and gradient centralization (Yong et al. 2020) ---------
def sgd_gc_inplace(
    p, grad, momentum_buffer, *, lr, momentum, weight_decay, maximize, buf_decay, grad_coef
):
    d_p = torch.where(maximize, -grad, grad).add(p, alpha=weight_decay)
    d_p = d_p - d_p.mean(dim=-1, keepdim=True)  # each row's mean (2-D weights)
    momentum_buffer.mul_(buf_decay).add_(d_p, alpha=grad_coef)
    p.add_(momentum_buffer, alpha=-lr)


def sgd_gc_functional(
    p, grad, momentum_buffer, *, lr, momentum, weight_decay, maximize, buf_decay, grad_coef
):
    d_p = torch.where(maximize, -grad, grad) + weight_decay * p
    d_p = d_p - torch.mean(d_p, dim=1, keepdim=True)
    buf = momentum_buffer * buf_decay + d_p * grad_coef
    return p - buf * lr, buf


ADAM_DEFAULTS = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, maximize=False)
SGD_DEFAULTS = dict(lr=1e-2, momentum=0.9, dampening=0.0, weight_decay=1e-4, maximize=False)
LION_DEFAULTS = dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
ADAN_DEFAULTS = dict(lr=1e-3, betas=(0.98, 0.92, 0.99), eps=1e-8, weight_decay=0.02)
