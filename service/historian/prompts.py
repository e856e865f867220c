"""The memory step's prompts: its instructions, and how one batch of new information is shown."""

from __future__ import annotations

import json
from typing import Any

from service.historian.conversation import Conversation

MEMORY_SYSTEM = """你是一个专业的群聊记忆管理员。根据最新信息，通过调用工具维护长期记忆数据库。
You maintain the long-term memory of a chat bot by calling tools.

1. 分析新信息与【现有记忆】之间的关系。
2. 全新信息调用 add_memory；与现有记忆冲突或是状态更新，调用 update_memory（必须使用对应的 ID）；
   计划取消或事实失效，调用 delete_memory（必须使用对应的 ID）。
   细微的语义变化（如称呼变化）也是更新。
3. 内容必须是独立、绝对的陈述：写出人名和 ID、绝对日期，不用代词和相对时间。
4. 作用域 scope：群里得知的信息默认 GROUP（关于整个群）或 MEMBER_IN_GROUP（关于某人在本群）。
   私聊里得知的信息默认 PRIVATE（只在这个私聊可见）。GLOBAL 只用于标记了 "shareable": true
   的新信息（本人同意让别处知道），并用 item 写明是哪一条；健康、证件号、联系方式等敏感信息
   永远不写 GLOBAL。GLOBAL only for an item marked "shareable": true, named by its item number.
   add_memory / update_memory 都用 item 写明依据的是哪一条新信息。Name the item every change
   is made from.
5. 将来要提醒或要做的事用 add_todo（trigger_time 用绝对时间）；对话说明待办完成或取消时用
   complete_todo / cancel_todo。
6. 没有值得记的就不调用任何工具。Call nothing if nothing is worth remembering."""


def memory_prompt(
    conversation: Conversation,
    items: list[tuple[str, str]],
    known: dict[int, dict[str, Any]],
    pending: list[dict[str, Any]],
) -> str:
    """The memory step's user message: the conversation, what is known, what is new."""
    lines = [f"当前时间 Now: {conversation.moment:%Y-%m-%d %H:%M %z}"]
    if conversation.request_type == "group":
        lines.append(
            f"会话 Conversation: 群 {conversation.group_name or ''}({conversation.group_id})"
        )
    else:
        lines.append("会话 Conversation: 私聊 private chat (PRIVATE; GLOBAL only if shareable)")
    people = [f"{name or '?'}({uid})" for uid, name in conversation.participants.items()]
    lines.append("参与者 Participants: " + ", ".join(people))
    if conversation.speaker_id:
        lines.append(
            "说话人 Speaker (default user_id): "
            f"{conversation.speaker_name or ''}({conversation.speaker_id})"
        )
    lines.append("【现有记忆】Existing memories:")
    for memory_id, row in sorted(known.items()):
        lines.append(f"[ID: {memory_id}] ({row['scope']}, {row['category']}) {row['content']}")
    if not known:
        lines.append("(none)")
    lines.append("【待办】Pending todos:")
    for todo in pending:
        when = todo["trigger_time"].isoformat() if todo["trigger_time"] else "untimed"
        lines.append(f"[TODO: {todo['id']}] {todo['description']} ({when})")
    if not pending:
        lines.append("(none)")
    lines.append("【新信息】New information:")
    for n, (text, original) in enumerate(items):
        shown: dict[str, Any] = {"item": n, "text": text, "original": original}
        if n in conversation.shareable:
            shown["shareable"] = True
        lines.append(json.dumps(shown, ensure_ascii=False))
    return "\n".join(lines)
