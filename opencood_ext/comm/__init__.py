"""What crosses the network between agents: the message wire format
(:mod:`.wire`), channel effects (:mod:`.channel`: pose noise, latency, loss), the
receiver's bounds and alliance key (:mod:`.receiver`) and the one transmission
path every fusion method uses (:mod:`.messages`)."""
from .channel import ChannelConfig, ChannelEffects, apply_channel, parse_pose_noise
from .messages import Acceptance, Delivery, Messages, Receipt, ReceiverContext, receive_frame, transmit
from .receiver import FrameBudget, ReceiverConfig
from .wire import (HEADER_SIZE, SIGNATURE_SIZE, BoxRules, Message, MessageError, check_pose, decode, encode,
                   message_nbytes)

__all__ = ["Message", "MessageError", "encode", "decode", "check_pose", "message_nbytes",
           "HEADER_SIZE", "SIGNATURE_SIZE", "BoxRules", "ChannelEffects", "ChannelConfig", "apply_channel",
           "parse_pose_noise", "Messages", "Acceptance", "Delivery", "Receipt", "ReceiverContext", "receive_frame",
           "transmit", "FrameBudget", "ReceiverConfig"]
